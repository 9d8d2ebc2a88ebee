"""The watchdog over the driver's waits (core/runtime/watchdog.py): a worker call that runs long
is named in a log line each period, one past its limit ends with an error naming the call and
the setting, and the worker it gave up on is stopped rather than awaited."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from typing import Protocol

import pytest

from core.runtime.actors import ProcessActor
from core.runtime.handles import typed
from core.runtime.placement import LearnerGroup
from core.runtime.watchdog import PhaseTimeoutError, Watch
from tests.core.runtime.dying_rank import Rank


class Napper(Protocol):
    def nap(self, seconds: float) -> float: ...

    def close(self) -> None: ...


def _waiting_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]


@pytest.mark.unit
def test_a_wait_is_named_each_period_then_ends_naming_the_call_and_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = Watch("rollout", warn_s=0.2, timeout_s=0.7, setting="watchdog.timeout_s")
    never: cf.Future = cf.Future()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="core.runtime.watchdog"):
        with pytest.raises(PhaseTimeoutError, match=r"rollout\.evaluate\(\) did not answer "
                           r"within 0\.7 s \(watchdog\.timeout_s\)"):  # fmt: skip
            watch.wait("evaluate", never)
    assert 0.6 < time.monotonic() - started < 2.0
    lines = _waiting_lines(caplog)
    assert 2 <= len(lines) <= 4, lines
    assert lines[0].startswith("waiting for rollout.evaluate(): 0 s so far (limit 0.7 s")


@pytest.mark.unit
def test_a_call_that_answers_in_time_is_returned_and_nothing_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: cf.Future = cf.Future()
    done.set_result(7)
    with caplog.at_level(logging.WARNING, logger="core.runtime.watchdog"):
        assert Watch("learner", warn_s=0.1, timeout_s=1.0).wait("rl_update", done) == 7
    assert not _waiting_lines(caplog)


@pytest.mark.unit
def test_a_method_with_its_own_limit_and_quiet_wait(caplog: pytest.LogCaptureFixture) -> None:
    """The batch wait: the worker reports it itself (quiet here), under rollout.stall_timeout_s."""
    watch = Watch(
        "rollout", warn_s=0.1, timeout_s=60.0,
        limits={"prepare_batch": (0.35, "rollout.stall_timeout_s")},
        quiet=frozenset({"prepare_batch"}),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="core.runtime.watchdog"):
        with pytest.raises(PhaseTimeoutError, match=r"within 0\.35 s \(rollout\.stall_timeout_s\)"):
            watch.wait("prepare_batch", cf.Future())
    assert not _waiting_lines(caplog)


@pytest.mark.integration
def test_a_worker_that_never_answers_is_given_up_on_and_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    actor = ProcessActor(Rank, 0, name="rank-0")
    worker = typed(actor, Napper, Watch("rank", warn_s=0.3, timeout_s=1.5))
    try:
        assert worker.nap(0.05) == 0.05  # a call in time passes straight through
        with caplog.at_level(logging.WARNING):
            with pytest.raises(PhaseTimeoutError, match=r"rank\.nap\(\) did not answer"):
                worker.nap(600)  # the worker would answer in ten minutes
        assert len(_waiting_lines(caplog)) >= 3
    finally:
        started = time.monotonic()
        worker.close()  # busy with the call it was given up on: terminated, not awaited
    assert time.monotonic() - started < 15 and not actor.process.is_alive()
    assert any("busy with nap(): terminating it" in r.getMessage() for r in caplog.records)


@pytest.mark.integration
def test_a_learner_group_call_is_watched_on_every_rank() -> None:
    group = LearnerGroup([ProcessActor(Rank, r, name=f"learner-{r}") for r in range(2)])
    learners = typed(group, Napper, Watch("learner", warn_s=0.3, timeout_s=1.0))
    try:
        assert learners.nap(0.05) == 0.05
        with pytest.raises(PhaseTimeoutError, match=r"learner\.nap\(\) did not answer within 1 s"):
            learners.nap(600)
    finally:
        learners.close()
    assert not any(rank.process.is_alive() for rank in group.ranks)
