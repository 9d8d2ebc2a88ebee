"""The draw ledger: draw → consume out of order → checkpoint → resume skips what was trained and
draws the outstanding prompts again, at the same place in the stream (so with the same seed)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from core.data.dataloader import ResumableDataLoader
from core.inference.api import WeightSource
from core.rollout.api import Trajectory
from core.rollout.executor import RolloutExecutor
from core.runtime.draw_ledger import SKIP_KEY, Draw, DrawLedger
from tests.core.rollout.test_executor import EchoWorkflow, TickEngine, check_counters

pytestmark = pytest.mark.unit

DATA = [{"id": f"p{i}"} for i in range(10)]


def loader() -> ResumableDataLoader:
    return ResumableDataLoader(DATA, batch_size=1, shuffle=True, seed=3)


def stream(n: int) -> list[tuple[str, int, int]]:
    """The first ``n`` draws of an uninterrupted loader: (id, epoch, position) of its cursor
    before each draw (the first draw of an epoch > 0 sees the last one's end, ``(e - 1, N)``)."""
    source, out = loader(), []
    for _ in range(n):
        epoch, position = source.epoch, source.position
        out.append((source.next_samples(1)[0]["id"], epoch, position))
    return out


def place(draw: Draw) -> tuple[str, int, int]:
    return draw.sample["id"], draw.epoch, draw.position


def resumed(state: dict) -> DrawLedger:
    """A fresh ledger restored from ``state`` as a resumed worker builds it (via JSON)."""
    return DrawLedger.restore(loader(), json.loads(json.dumps(state)))


def test_fresh_ledger_draws_the_loader_stream() -> None:
    ledger = DrawLedger(loader())
    draws = [ledger.draw() for _ in range(12)]  # crosses into epoch 1
    assert [place(d) for d in draws] == stream(12)
    assert [d.index for d in draws] == list(range(12))
    assert (draws[10].epoch, draws[10].position) == (0, 10)  # epoch 1's first draw
    assert (draws[11].epoch, draws[11].position) == (1, 1)


def test_checkpoint_with_nothing_outstanding_is_the_current_position() -> None:
    ledger = DrawLedger(loader())
    for _ in range(4):
        ledger.draw()
    state = ledger.state_dict(live=[])
    assert state[SKIP_KEY] == []
    assert (state["dataloader"]["epoch"], state["dataloader"]["position"]) == (0, 4)
    assert [place(resumed(state).draw())] == stream(5)[4:]


def test_resume_skips_consumed_and_redraws_outstanding() -> None:
    ledger = DrawLedger(loader())
    for _ in range(8):
        ledger.draw()
    # draw 1 is still generating, 5 is ready but not consumed; 0, 2-4, 6, 7 were trained
    state = ledger.state_dict(live=[1, 5])
    assert state[SKIP_KEY] == [1, 2, 3, 5, 6]  # offsets from draw 1, the oldest outstanding
    assert ledger.outstanding == [1, 5]
    again = resumed(state)
    redrawn = [again.draw() for _ in range(4)]
    expected = stream(10)
    assert [place(d) for d in redrawn] == [expected[1], expected[5], expected[8], expected[9]]
    assert again.skipped == 5


def test_epoch_boundary_inside_the_outstanding_window() -> None:
    ledger = DrawLedger(loader())
    for _ in range(13):  # epoch 0 is 10 draws: 10-12 are epoch 1's first three
        ledger.draw()
    # draw 8 (epoch 0) and 11 (epoch 1) outstanding; everything else consumed
    state = ledger.state_dict(live=[8, 11])
    assert (state["dataloader"]["epoch"], state["dataloader"]["position"]) == (0, 8)
    assert state[SKIP_KEY] == [1, 2, 4]  # draws 9, 10 and 12
    again = resumed(state)
    expected = stream(16)
    redrawn = [place(again.draw()) for _ in range(4)]
    assert redrawn == [expected[8], expected[11], expected[13], expected[14]]
    assert redrawn[1][1:] == (1, 1)  # epoch 1, position 1: the same seed as before the kill
    # over the two lives, exactly the uninterrupted stream's first 15 draws, each once
    first_life_trained = [expected[i] for i in range(13) if i not in (8, 11)]
    lives = first_life_trained + redrawn
    assert sorted(lives, key=lambda p: (p[1], p[2])) == expected[:15]


def test_a_second_checkpoint_inside_the_skip_window_keeps_what_is_not_reached() -> None:
    ledger = DrawLedger(loader())
    for _ in range(10):
        ledger.draw()
    state = ledger.state_dict(live=[2, 6])  # 0, 1, 3-5, 7-9 consumed
    assert state[SKIP_KEY] == [1, 2, 3, 5, 6, 7]
    again = resumed(state)
    first = again.draw()  # draw 2 again: index 0 of the resumed ledger
    assert place(first) == stream(3)[2]
    # checkpoint again before the resumed ledger reached draw 6: 2 is still outstanding
    state2 = again.state_dict(live=[first.index])
    assert state2["dataloader"] == state["dataloader"]
    assert state2[SKIP_KEY] == state[SKIP_KEY]
    # ... and after 2 was consumed: the origin moves to draw 6
    second = again.draw()
    assert place(second) == stream(7)[6]
    state3 = again.state_dict(live=[second.index])
    assert (state3["dataloader"]["epoch"], state3["dataloader"]["position"]) == (0, 6)
    assert state3[SKIP_KEY] == [1, 2, 3]  # draws 7-9
    third = resumed(state3)
    assert [place(third.draw()) for _ in range(2)] == [stream(7)[6], stream(11)[10]]


def test_an_old_checkpoint_without_the_skip_list_resumes_as_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = DrawLedger(loader())
    for _ in range(5):
        ledger.draw()
    state = ledger.state_dict(live=[1])
    del state[SKIP_KEY]
    with caplog.at_level(logging.WARNING):
        again = resumed(state)
    assert "records no skip_draws" in caplog.text
    assert [place(again.draw()) for _ in range(4)] == stream(5)[1:]  # 2-4 trained again


def test_negative_offsets_are_refused() -> None:
    with pytest.raises(ValueError, match="skip_draws"):
        DrawLedger(loader(), skip=[-1])


# ---------------------------------------------------------------- with the executor


class FirstDrawSlow(EchoWorkflow):
    """The first draw of each life waits until the learner reaches ``release``: the slow
    generation of the issue (later draws are trained while it is in flight)."""

    def __init__(self, release: int) -> None:
        super().__init__(n_tokens=2)
        self.release = release

    async def run_episode(self, engine: Any, sample: dict[str, Any]) -> Trajectory | None:
        while sample["_draw"] == 0 and engine.version < self.release:
            await asyncio.sleep(0.001)
        return await super().run_episode(engine, sample)


def source(ledger: DrawLedger, drawn: list[tuple[int, int]]) -> Any:
    def next_sample() -> dict[str, Any]:
        draw = ledger.draw()
        drawn.append((draw.epoch, draw.position))
        place = (draw.epoch, draw.position)
        return {**draw.sample, "_draw": draw.index, "_place": place, "reward": 1}

    return next_sample


async def learn(executor: Any, engine: TickEngine, start: int, steps: int) -> list[list[Any]]:
    """As the trainer: a batch, then publish the next version, ``steps`` times from ``start``."""
    batches = []
    for version in range(start + 1, start + steps + 1):
        batches.append(await executor.prepare_batch(timeout_s=30))
        await asyncio.sleep(0.01)  # training: the groups in flight finish meanwhile
        await engine.pause()
        await engine.update_weights(WeightSource(state_dict={}), version)
        executor.set_version(version)
        await engine.resume()
    return batches


def test_executor_resume_trains_each_draw_once_across_an_epoch_boundary() -> None:
    """η=2, B=2, 6 prompts per epoch: at the version-2 checkpoint draw 0 is in flight, later
    draws (some from epoch 1) are trained or ready; the resumed executor's counters restart
    right, and over both lives no (epoch, position) is trained twice and none is lost."""
    data = [{"id": f"p{i}"} for i in range(6)]
    eta, batch_size = 2, 2

    def executor_for(engine: TickEngine) -> Any:
        return RolloutExecutor(
            engine, FirstDrawSlow(release=3), batch_size=batch_size, group_size=1,
            max_staleness=eta, max_concurrent=64,
        )  # fmt: skip

    async def main() -> None:
        engine, drawn_before = TickEngine(), []
        executor = executor_for(engine)
        ledger = DrawLedger(ResumableDataLoader(data, batch_size=1, shuffle=True, seed=3))
        executor.start(source(ledger, drawn_before))
        before = await learn(executor, engine, 0, steps=2)
        await asyncio.sleep(0.02)  # the submitter fills the window v=2 opened; some finish
        ready = len(executor._ready)
        state = {
            **ledger.state_dict(s["_draw"] for s in executor.outstanding_samples()),
            "counters": executor.counters.as_dict(),
        }
        await executor.stop()  # the kill
        trained_before = [g.sample["_place"] for b in before for g in b]
        assert (0, 0) not in trained_before and len(drawn_before) > 6  # the scenario
        assert state[SKIP_KEY]  # later draws were trained while draw 0 was in flight
        assert ready  # and some groups were ready but not consumed: they are drawn again

        engine, drawn_after = TickEngine(), []
        await engine.pause()
        await engine.update_weights(WeightSource(state_dict={}), 2)
        await engine.resume()
        executor = executor_for(engine)
        executor.recover(2, state["counters"])
        c = executor.counters
        assert (c.accepted, c.consumed, c.running) == (2 * batch_size, 2 * batch_size, 0)
        check_counters(executor)
        assert executor.capacity() == (eta + 1) * batch_size
        loader = ResumableDataLoader(data, batch_size=1, shuffle=True, seed=3)
        executor.start(source(DrawLedger.restore(loader, state), drawn_after))
        after = await learn(executor, engine, 2, steps=6)
        check_counters(executor)
        await executor.stop()

        trained_after = [g.sample["_place"] for b in after for g in b]
        trained = trained_before + trained_after
        assert len(trained) == len(set(trained)) == 8 * batch_size  # none twice
        untrained = set(drawn_before) - set(trained_before)
        assert untrained <= set(drawn_after)  # every outstanding draw drawn again
        assert untrained <= set(trained_after)  # ... and trained
        assert not set(drawn_after) & set(trained_before)  # nothing trained is drawn again
        assert {p[0] for p in trained} == {0, 1, 2}  # the window spans epoch boundaries

    asyncio.run(asyncio.wait_for(main(), timeout=60))
