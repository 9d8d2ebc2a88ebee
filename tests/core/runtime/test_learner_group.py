"""A learner rank that dies is named, with its node, at once (the other ranks may be stuck in a
collective with it). An inference server killed mid-run: see test_trainer's staleness test."""

from __future__ import annotations

import time

import pytest

from core.runtime.actors import ProcessActor
from core.runtime.placement import LearnerGroup, LearnerRankError
from tests.core.runtime.dying_rank import Rank


def test_a_dead_learner_rank_is_named_at_once() -> None:
    ranks = [ProcessActor(Rank, r, name=f"learner-{r}") for r in range(2)]
    group = LearnerGroup(ranks)
    try:
        started = time.monotonic()
        with pytest.raises(
            LearnerRankError, match=r"learner rank 1 of 2 \(node .+\) failed in step"
        ):
            group.call("step")
        assert time.monotonic() - started < 30  # not after rank 0's 60 s wait
    finally:
        ranks[0].process.kill()
        group.close()
