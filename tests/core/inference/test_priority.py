"""Request priorities: the engine's waiting queue serves the smallest priority first, and the
rollout executor gives every group's requests its submission number."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.inference.api import GenerationRequest, SamplingParams, request_priority
from core.inference.batching import Slot
from core.inference.hf_engine import HFEngine, WaitQueue
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
