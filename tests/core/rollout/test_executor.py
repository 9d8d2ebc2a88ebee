"""The staleness-bounded executor against a scripted learner that advances versions.

The engine here is a small token generator in the test (one token per ``token_delay`` seconds,
stamped with its current version, aborting on pause) so that timing and versions are controlled
exactly; the real HF engine runs the same executor in tests/core/runtime/test_rollout_worker.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import random
from typing import Any

import pytest

from core.inference.api import (
    GenerationRequest,
    GenerationResponse,
    SamplingParams,
    WeightSource,
    generate_resuming,
)
from core.rollout.api import Group, Trajectory
from core.rollout.executor import RolloutError, RolloutExecutor

_current_sample: contextvars.ContextVar[str] = contextvars.ContextVar("_current_sample")

pytestmark = pytest.mark.unit


class TickEngine:
    """Emits token ``len(prompt)+i`` every ``token_delay`` s; pause aborts in-flight requests."""

    def __init__(self, token_delay: float = 0.001) -> None:
        self.token_delay = token_delay
        self._version = 0
        self._running = asyncio.Event()
        self._running.set()
        self.aborts = 0
        self.in_flight = 0

    @property
    def version(self) -> int:
        return self._version

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        await self._running.wait()
        self.in_flight += 1
        try:
            return await self._generate(request)
        finally:
            self.in_flight -= 1

    async def _generate(self, request: GenerationRequest) -> GenerationResponse:
        out: list[int] = []
        versions: list[int] = []
        for _ in range(request.sampling.max_new_tokens):
            await asyncio.sleep(self.token_delay * random.uniform(0.5, 1.5))
            if not self._running.is_set():
                self.aborts += 1
                return GenerationResponse(out, [0.0] * len(out), versions, "abort")
            out.append(len(request.input_ids) + len(out))
            versions.append(self._version)
        return GenerationResponse(out, [0.0] * len(out), versions, "length")

    async def pause(self) -> None:
        """Like a real engine: returns once every in-flight request has come back aborted."""
        self._running.clear()
        while self.in_flight:
            await asyncio.sleep(0.001)

    async def resume(self) -> None:
        self._running.set()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        assert not self._running.is_set(), "weights must be swapped while paused"
        self._version = version

    async def wait_until_resumed(self) -> None:
        await self._running.wait()


class EchoWorkflow:
    """Generates ``n_tokens`` and rewards by sample; can reject or raise on chosen samples."""

    def __init__(
        self, n_tokens: int = 8, reject: set[str] = frozenset(), fail: set[str] = frozenset()
    ):
        self.n_tokens = n_tokens
        self.reject = reject
        self.fail = fail

    async def run_episode(self, engine: Any, sample: dict[str, Any]) -> Trajectory | None:
        if sample["id"] in self.fail:
            raise ValueError(f"tool crashed on {sample['id']}")
        prompt = [1, 2, 3]
        response = await generate_resuming(
            engine, GenerationRequest(prompt, SamplingParams(self.n_tokens))
        )
        if sample["id"] in self.reject:
            return None
        n = len(response.output_ids)
        return Trajectory(
            input_ids=prompt + response.output_ids,
            loss_mask=[0] * 3 + [1] * n,
            logprobs=[0.0] * 3 + response.logprobs,
            versions=[-1] * 3 + response.versions,
            reward=float(sample["reward"]),
            prompt_len=3,
            metadata={"n_resumes": response.n_resumes},
        )


def sample_stream():
    counter = iter(range(10**9))

    def next_sample() -> dict[str, Any]:
        i = next(counter)
        return {"id": f"s{i}", "reward": i % 2}

    return next_sample


async def scripted_learner(
    executor: RolloutExecutor, engine: TickEngine, steps: int, train_seconds: float = 0.01
) -> list[list[Group]]:
    """prepare_batch → 'train' → pause → update weights → version+1 → resume, ``steps`` times."""
    batches = []
    for step in range(steps):
        batch = await executor.prepare_batch(timeout_s=30)
        for group in batch:  # what the tests are about: never older than η at consumption
            assert executor.version - group.oldest_version <= executor.max_staleness
        batches.append(batch)
        await asyncio.sleep(train_seconds)
        executor.pause()
        await engine.pause()
        await engine.update_weights(WeightSource(state_dict={}), step + 1)
        executor.set_version(step + 1)
        await engine.resume()
        executor.resume()
    return batches


def check_counters(executor: RolloutExecutor) -> None:
    c = executor.counters
    assert c.running == len([t for t in executor._tasks if not t.done()])
    finished = c.accepted + c.dropped_stale + c.rejected + c.failed
    assert c.submitted == finished + c.running
    assert c.accepted == c.consumed + len(executor._ready)
    assert sum(c.staleness.values()) == c.consumed


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def make(
    engine, workflow, *, eta: int, batch_size: int = 4, group_size: int = 2, **kw
) -> RolloutExecutor:
    return RolloutExecutor(
        engine,
        workflow,
        batch_size=batch_size,
        group_size=group_size,
        max_staleness=eta,
        max_concurrent=64,
        **kw,
    )


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
def test_staleness_never_exceeds_eta(eta: int) -> None:
    async def main():
        engine = TickEngine()
        executor = make(engine, EchoWorkflow(n_tokens=12), eta=eta)
        executor.start(sample_stream())
        batches = await scripted_learner(executor, engine, steps=8, train_seconds=0.02)
        check_counters(executor)
        await executor.stop()
        return executor, batches, engine

    executor, batches, engine = run(main())
    assert len(batches) == 8 and all(len(b) == 4 for b in batches)
    assert max(executor.counters.staleness) <= eta
    if eta == 0:
        # synchronous: every token of every consumed sample came from the current version
        assert set(executor.counters.staleness) == {0}
        assert engine.aborts == 0
        for step, batch in enumerate(batches):
            for group in batch:
                for t in group.trajectories:
                    assert {v for v, m in zip(t.versions, t.loss_mask) if m} == {step}
    else:
        # asynchronous: generation overlapped training, so some samples are off-policy
        assert any(s > 0 for s in executor.counters.staleness)


def test_interrupted_episodes_mix_versions() -> None:
    async def main():
        engine = TickEngine(token_delay=0.003)
        executor = make(engine, EchoWorkflow(n_tokens=30), eta=2)
        executor.start(sample_stream())
        batches = await scripted_learner(executor, engine, steps=6, train_seconds=0.03)
        await executor.stop()
        return batches, engine

    batches, engine = run(main())
    assert engine.aborts > 0
    mixed = [
        t
        for b in batches
        for g in b
        for t in g.trajectories
        if len({v for v, m in zip(t.versions, t.loss_mask) if m}) > 1
    ]
    assert mixed, "some episode should span a weight update"
    for t in mixed:
        generated = [v for v, m in zip(t.versions, t.loss_mask) if m]
        assert generated == sorted(generated)  # versions never go back within an episode
        assert len(generated) == 30  # the budget is kept across resumes
        assert t.metadata["n_resumes"] >= 1


def test_capacity_formula_and_counters_before_any_consumption() -> None:
    async def main():
        engine = TickEngine(token_delay=0.01)
        executor = make(engine, EchoWorkflow(n_tokens=4), eta=1, batch_size=3)
        assert executor.capacity() == (1 + 0 + 1) * 3
        executor.start(sample_stream())
        await asyncio.sleep(0.3)  # all admitted groups finish; nothing consumed
        c = executor.counters
        assert c.submitted == c.accepted == (1 + 0 + 1) * 3  # the bound at version 0
        assert executor.capacity() == 0
        executor.set_version(1)
        await asyncio.sleep(0.3)
        assert executor.counters.submitted == (1 + 1 + 1) * 3
        check_counters(executor)
        await executor.stop()

    run(main())


def test_rejected_and_failed_groups_free_their_slots_without_deadlock() -> None:
    rejects = {f"s{i}" for i in range(0, 200, 3)}
    fails = {f"s{i}" for i in range(1, 200, 10)}

    async def main():
        engine = TickEngine()
        workflow = EchoWorkflow(n_tokens=4, reject=rejects, fail=fails)
        executor = make(engine, workflow, eta=0, batch_size=4, max_failure_rate=0.5)
        executor.start(sample_stream())
        batches = await scripted_learner(executor, engine, steps=6)
        check_counters(executor)
        await executor.stop()
        return executor, batches

    executor, batches = run(main())
    c = executor.counters
    assert c.rejected > 0 and c.failed > 0
    consumed_ids = {g.sample_id for b in batches for g in b}
    assert not consumed_ids & (rejects | fails)
    assert c.consumed == 6 * 4


def test_group_filter_drops_uniform_groups() -> None:
    async def main():
        engine = TickEngine()
        executor = make(
            engine,
            EchoWorkflow(n_tokens=2),
            eta=0,
            group_filter=lambda g: len(set(g.rewards)) > 1 or g.sample_id.endswith("1"),
        )
        executor.start(sample_stream())
        batches = await scripted_learner(executor, engine, steps=3)
        check_counters(executor)
        await executor.stop()
        return executor, batches

    executor, batches = run(main())
    # all rewards in a group are equal in this workflow, so only ids ending in 1 pass the filter
    assert all(g.sample_id.endswith("1") for b in batches for g in b)
    assert executor.counters.rejected > 0


class TurnsWorkflow(EchoWorkflow):
    """Each episode as 1-3 rows (an agent's calls trained one by one); sample "bad" breaks the
    contract with rows of different rewards."""

    async def run_episode(self, engine: Any, sample: dict[str, Any]) -> list[Trajectory] | None:
        row = await super().run_episode(engine, sample)
        assert row is not None
        n = 1 + sample["seed"] % 3
        rows = [dataclasses.replace(row, metadata=dict(row.metadata)) for _ in range(n)]
        if sample["id"] == "bad":
            rows.append(dataclasses.replace(row, reward=row.reward + 1))
        return rows


def test_episodes_of_several_rows_make_one_group() -> None:
    samples = iter([{"id": "bad", "reward": 1, "seed": 0}] +
                   [{"id": f"s{i}", "reward": i % 2, "seed": i} for i in range(100)])  # fmt: skip

    async def main():
        engine = TickEngine()
        executor = make(engine, TurnsWorkflow(n_tokens=2), eta=0, group_size=3,
                        max_failure_rate=1.0)  # fmt: skip
        executor.start(lambda: next(samples))
        batch = await executor.prepare_batch(timeout_s=30)
        await executor.stop()
        return executor, batch

    executor, batch = run(main())
    assert executor.counters.failed >= 1  # "bad" returned rows with two rewards
    for group in batch:
        assert group.sample_id != "bad" and group.n_episodes == 3
        assert len(group.trajectories) == len(group.episode_of) >= 3
        assert group.episode_of == sorted(group.episode_of)
        assert group.rewards == [group.trajectories[0].reward] * 3  # one per episode
        indices = [t.metadata["group_index"] for t in group.trajectories]
        assert indices == group.episode_of
    assert any(len(group.trajectories) > 3 for group in batch)


def test_a_filter_that_refuses_everything_warns_then_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DAPO with every group's rewards equal: it used to spin at 100 % CPU with no log line."""

    async def main():
        executor = make(
            TickEngine(),
            EchoWorkflow(n_tokens=2),
            eta=0,
            group_filter=lambda g: False,
            max_filtered_in_a_row=12,
        )
        executor.start(sample_stream())
        with pytest.raises(RolloutError, match=r"refused 12 groups in a row.*dynamic_sampling"):
            await executor.prepare_batch(timeout_s=20)
        await executor.stop()
        return executor

    with caplog.at_level("WARNING", logger="core.rollout.executor"):
        executor = run(main())
    warnings = [r.getMessage() for r in caplog.records if "refused the last" in r.getMessage()]
    # one warning per batch_size (4) refused groups; groups already running may finish after
    # the 12th, before prepare_batch sees the error
    assert executor.counters.filtered == executor.counters.filtered_in_a_row >= 12
    assert len(warnings) == executor.counters.filtered // 4


def test_a_stalled_batch_is_logged_then_times_out_saying_what_it_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main():
        engine = TickEngine()
        executor = make(engine, EchoWorkflow(n_tokens=2), eta=0)
        executor.start(sample_stream())
        await engine.pause()  # the engine stops answering: nothing finishes
        with pytest.raises(TimeoutError, match=r"stall_timeout_s.*0/4 groups ready.*running"):
            await executor.prepare_batch(timeout_s=1.0, warn_every_s=0.3)
        await engine.resume()
        await executor.stop()

    with caplog.at_level("WARNING", logger="core.rollout.executor"):
        run(main())
    stalls = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no batch for")]
    assert 2 <= len(stalls) <= 4 and "engine version 0" in stalls[0]


def test_too_many_failures_stop_the_run_with_a_clear_error() -> None:
    async def main():
        engine = TickEngine()
        executor = make(
            engine, EchoWorkflow(fail={f"s{i}" for i in range(1000)}), eta=0, max_failure_rate=0.2
        )
        executor.start(sample_stream())
        with pytest.raises(RolloutError, match="max_failure_rate=0.2.*tool crashed"):
            await executor.prepare_batch(timeout_s=20)
        await executor.stop()

    run(main())


class HangingWorkflow(EchoWorkflow):
    """An environment whose tool never returns on every eighth prompt (the issue's probe)."""

    async def run_episode(self, engine: Any, sample: dict[str, Any]) -> Trajectory | None:
        if int(sample["id"][1:]) % 8 == 3:
            await asyncio.Event().wait()  # forever
        return await super().run_episode(engine, sample)


def test_an_episode_that_never_returns_is_cancelled_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past rollout.episode_timeout_s a hung episode is cancelled and its group counts as failed,
    so batches keep coming; without the limit its slot would be held for ever."""

    async def main() -> None:
        engine = TickEngine()
        executor = make(
            engine, HangingWorkflow(n_tokens=2), eta=1, batch_size=4, max_failure_rate=0.5,
            episode_timeout_s=0.3,
        )  # fmt: skip
        executor.start(sample_stream())
        batches = await scripted_learner(executor, engine, steps=3)
        await asyncio.sleep(0.5)  # the hung episodes submitted meanwhile time out too
        await executor.stop()
        c = executor.counters
        assert all(int(g.sample_id[1:]) % 8 != 3 for b in batches for g in b)
        assert c.episodes_timed_out >= 1 and c.failed >= 1
        assert c.episodes_failed >= c.episodes_timed_out

    with caplog.at_level("WARNING", logger="core.rollout.executor"):
        run(main())
    assert any("rollout.episode_timeout_s=0.3 s" in r.getMessage() for r in caplog.records)


def test_recover_restarts_accepted_at_v_times_b() -> None:
    async def main():
        engine = TickEngine()
        executor = make(engine, EchoWorkflow(n_tokens=2), eta=1, batch_size=2)
        # recovery re-publishes the checkpoint's weights before rollouts restart
        await engine.pause()
        await engine.update_weights(WeightSource(state_dict={}), 5)
        await engine.resume()
        executor.recover(
            5, {"submitted": 12, "consumed": 10, "rejected": 1, "staleness": {"0": 4, "1": 6}}
        )
        assert executor.counters.accepted == 10 and executor.counters.running == 0
        # the 1 group outstanding at the checkpoint is no longer counted as started
        assert executor.counters.submitted == 10 + 1
        check_counters(executor)
        assert executor.capacity() == (1 + 5 + 1) * 2 - 10
        executor.start(sample_stream())
        batch = await executor.prepare_batch(timeout_s=10)
        assert len(batch) == 2
        assert executor.counters.staleness[0] >= 4
        check_counters(executor)
        await executor.stop()

    run(main())


def test_pause_stops_submission() -> None:
    async def main():
        engine = TickEngine()
        executor = make(engine, EchoWorkflow(n_tokens=2), eta=3)
        executor.pause()
        executor.start(sample_stream())
        await asyncio.sleep(0.1)
        assert executor.counters.submitted == 0
        executor.resume()
        await asyncio.sleep(0.1)
        assert executor.counters.submitted == (3 + 0 + 1) * 4
        await executor.stop()

    run(main())


def test_engine_behind_the_learner_is_an_error_not_a_spin() -> None:
    async def main():
        engine = TickEngine()  # still at version 0
        executor = make(engine, EchoWorkflow(n_tokens=2), eta=1)
        executor.recover(3)
        recovered = executor.counters.submitted  # the 3 batches consumed before the checkpoint
        executor.start(sample_stream())
        with pytest.raises(RolloutError, match="engine serves version 0 but the learner is at 3"):
            await executor.prepare_batch(timeout_s=10)
        assert executor.counters.submitted == recovered == 3 * 4  # nothing started since
        await executor.stop()

    run(main())


def test_adaptive_staleness_stays_one_version_ahead_of_a_slow_learner() -> None:
    """Generation outpaces training: a fixed η = 4 makes batches up to 4 versions old for
    nothing; the adaptive window stays at 1, so no batch is older than 1 version."""

    async def main(adaptive: bool):
        engine = TickEngine(token_delay=0.001)
        executor = make(engine, EchoWorkflow(n_tokens=4), eta=4, adaptive_staleness=adaptive)
        executor.start(sample_stream())
        await scripted_learner(executor, engine, steps=8, train_seconds=0.1)
        check_counters(executor)
        await executor.stop()
        return executor.counters

    fixed, adaptive = run(main(False)), run(main(True))
    assert fixed.window == 4 and max(fixed.staleness) >= 2
    assert adaptive.window == 1 and max(adaptive.staleness) == 1
    assert adaptive.dropped_stale == 0


def test_adaptive_staleness_widens_while_the_learner_waits() -> None:
    """Generation is the bottleneck: every wait widens the window, up to η and never past it."""

    async def main():
        engine = TickEngine(token_delay=0.004)
        executor = make(engine, EchoWorkflow(n_tokens=10), eta=3, adaptive_staleness=True)
        executor.start(sample_stream())
        await scripted_learner(executor, engine, steps=6, train_seconds=0.0)
        check_counters(executor)
        await executor.stop()
        return executor.counters

    counters = run(main())
    assert counters.window == 3 and max(counters.staleness) <= 3


def test_adaptive_window_rules() -> None:
    executor = make(TickEngine(), EchoWorkflow(), eta=3, batch_size=4, adaptive_staleness=True)
    c = executor.counters
    assert c.window == 1 and executor.capacity() == (1 + 0 + 1) * 4
    executor._adapt_window(waited=True, spare=0)  # the run's first batch always waits
    assert c.window == 1
    for waited, spare, window in [
        (True, 0, 2),
        (True, 0, 3),
        (True, 0, 3),  # never past η
        (False, 3, 3),  # less than a whole spare batch: keep
        (False, 4, 2),
        (False, 8, 1),
        (False, 8, 1),  # never below 1
    ]:
        executor._adapt_window(waited=waited, spare=spare)
        assert c.window == window, (waited, spare)
    assert executor.capacity() == (1 + 0 + 1) * 4
    assert make(TickEngine(), EchoWorkflow(), eta=0, adaptive_staleness=True).counters.window == 0
    c.window = 3
    executor.recover(version=5, counters={"window": 7})  # a checkpoint's window, clamped to η
    assert c.window == 3


def test_each_groups_requests_carry_its_submission_number() -> None:
    """What the engine orders waiting calls by (oldest group first): every request of a group has
    the group's place in submission order, whatever the workflow did to make it."""
    seen: dict[str, set[int]] = {}

    class RecordingEngine(TickEngine):
        async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
            sample = _current_sample.get()
            seen.setdefault(sample, set()).add(request.priority)
            return await super().agenerate(request)

    class TaggingWorkflow(EchoWorkflow):
        async def run_episode(self, engine: Any, sample: dict[str, Any]) -> Trajectory | None:
            _current_sample.set(sample["id"])
            return await super().run_episode(engine, sample)

    async def main() -> None:
        engine = RecordingEngine()
        executor = make(engine, TaggingWorkflow(n_tokens=2), eta=0, batch_size=3, group_size=2)
        executor.start(sample_stream())
        await scripted_learner(executor, engine, steps=2)
        await executor.stop()

    run(main())
    by_sample = {k: v for k, v in seen.items() if k.startswith("s")}
    assert len(by_sample) >= 6
    # one priority per group (both episodes): the n-th group submitted (from 1) has priority n
    assert all(by_sample[f"s{i}"] == {i + 1} for i in range(6)), by_sample
