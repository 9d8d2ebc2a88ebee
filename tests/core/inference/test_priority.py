"""Request priorities: the engine's waiting queue serves the smallest priority first, and the
rollout executor gives every group's requests its submission number."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.inference.api import GenerationRequest, SamplingParams, request_priority
from core.inference.engine.batching import Slot
from core.inference.engine.hf_engine import HFEngine, WaitQueue
from core.models import load_model
from tests.core.inference.helpers import run

pytestmark = pytest.mark.unit


def _slot(priority: int) -> Slot:
    loop = asyncio.new_event_loop()
    try:
        request = GenerationRequest([1, 2], priority=priority)
        return Slot(request, frozenset(), loop, loop.create_future())
    finally:
        loop.close()


def test_the_queue_serves_smallest_priority_then_arrival_and_keeps_a_returning_place() -> None:
    queue = WaitQueue()
    slots = [_slot(p) for p in (3, 1, 3, 2, 1)]
    for slot in slots:
        queue.push(slot)
    assert list(queue) == [slots[1], slots[4], slots[3], slots[0], slots[2]]
    first = queue.pop()
    assert first is slots[1]
    newcomer = _slot(1)  # a later arrival of the same priority
    queue.push(newcomer)
    queue.push(first)  # put back (a retracting pause): ahead of it again
    assert [queue.pop() for _ in range(3)] == [first, slots[4], newcomer]


def test_requests_take_their_priority_from_the_task_that_makes_them() -> None:
    async def make(order: int) -> tuple[int, int]:
        request_priority.set(order)
        inner = await asyncio.create_task(asyncio.sleep(0, GenerationRequest([1])))
        return GenerationRequest([1]).priority, inner.priority

    async def main() -> list[tuple[int, int]]:
        return await asyncio.gather(make(7), make(2))

    assert run(main()) == [(7, 7), (2, 2)]
    assert GenerationRequest([1]).priority == 0  # outside: the default
    assert GenerationRequest([1], priority=5).priority == 5


def test_a_full_engine_serves_waiting_requests_by_priority(model_dir: Path) -> None:
    """One batch row: the request running first finishes, then the waiting ones in priority
    order, whatever order they arrived in."""
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0)
    finished: list[int] = []

    async def one(engine: HFEngine, priority: int) -> None:
        await engine.agenerate(GenerationRequest([5, 6, 7], sampling, priority=priority))
        finished.append(priority)

    async def main(engine: HFEngine) -> None:
        await engine.pause()
        tasks = [asyncio.create_task(one(engine, p)) for p in (9, 4, 6, 1)]
        while engine.num_waiting < 4:
            await asyncio.sleep(0.01)
        await engine.resume()
        await asyncio.gather(*tasks)

    with HFEngine(load_model(model_dir), None, max_batch_size=1, seed=0) as engine:
        run(main(engine))
    assert finished == [1, 4, 6, 9]


@pytest.mark.parametrize(
    ("priorities", "expected"),
    [("low-first", [1, 4, 6, 9]), ("high-first", [9, 6, 4, 1]), ("off", [9, 4, 6, 1])],
)
def test_our_server_orders_waiting_requests_as_sglang_does(
    model_dir: Path, priorities: str, expected: list[int]
) -> None:
    """Over HTTP: ``priority`` in ``/generate`` orders a one-row server's waiting requests as
    SGLang's flags say (lowest first, highest first, or first come first served)."""
    from core.inference.clients.sglang_client import SGLangClient
    from tests.core.inference.helpers import ServerThread

    sampling = SamplingParams(max_new_tokens=4, temperature=0.0)
    finished: list[int] = []
    servers = ServerThread()
    try:
        handle = servers.start(model_dir=model_dir, max_batch_size=1, priorities=priorities)
        engine = handle.engine
        client = SGLangClient([handle.address], send_priority=True)

        async def one(priority: int) -> None:
            await client.agenerate(GenerationRequest([5, 6, 7], sampling, priority=priority))
            finished.append(priority)

        async def main() -> None:
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(engine.pause(), servers.loop)
            )
            tasks = []
            for n, priority in enumerate((9, 4, 6, 1), start=1):  # arriving in this order
                tasks.append(asyncio.create_task(one(priority)))
                while engine.num_waiting < n:
                    await asyncio.sleep(0.01)
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(engine.resume(), servers.loop)
            )
            await asyncio.gather(*tasks)
            await client.aclose()

        run(main())
    finally:
        servers.close()
    assert finished == expected


def test_launched_servers_get_the_batch_cap_and_lowest_first_scheduling(
    model_dir: Path, tmp_path: Path
) -> None:
    """``inference.max_batch_rows`` with servers the run launches: each server decodes that many
    rows, serving the lowest priority first (SGLang's flags, which our server takes too), and
    the rollout's client sends every request's priority."""
    from core.config import load_config
    from core.inference.server.app import parse_args, priority_mode
    from core.runtime.fleet import server_spec, with_servers
    from core.runtime.rollout_worker import build_engine

    for launcher in ("asyncrl", "sglang"):
        config = load_config(
            None, ["inference.engine=sglang", f"inference.server_launcher={launcher}",
                   "inference.max_batch_rows=8", "rollout.max_concurrent=64"]
        )  # fmt: skip
        extra = server_spec(config, str(model_dir), 0, [str(tmp_path)], port=1234).extra_args
        assert extra[extra.index("--max-running-requests") + 1] == "8"
        assert "--enable-priority-scheduling" in extra
        assert "--schedule-low-priority-values-first" in extra
    args = parse_args(["--model", str(model_dir), *extra])
    assert args.max_batch_size == 8 and priority_mode(args) == "low-first"
    assert priority_mode(parse_args(["--model", str(model_dir)])) == "off"
    assert build_engine(with_servers(config, ["127.0.0.1:1"]), str(model_dir)).send_priority
    plain = load_config(None, ["inference.engine=sglang", "rollout.max_concurrent=64"])
    extra = server_spec(plain, str(model_dir), 0, [str(tmp_path)], port=1234).extra_args
    assert extra[extra.index("--max-running-requests") + 1] == "64"
    assert "--enable-priority-scheduling" not in extra
    assert not build_engine(with_servers(plain, ["127.0.0.1:1"]), str(model_dir)).send_priority
