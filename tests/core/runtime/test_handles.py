"""The typed worker handles: each mirrors its worker's methods exactly, calls go to the worker's
process, a name the handle does not declare fails before anything is sent, and no module but
the handles' own sends a method name as a string."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Protocol

import pytest

from core.runtime.actors import ProcessActor
from core.runtime.handles import LearnerHandle, LearnerRank, RolloutHandle, methods, typed
from core.runtime.learner_worker import LearnerWorker
from core.runtime.placement import LearnerGroup
from core.runtime.rollout_worker import RolloutWorker
from tests.core.runtime.dying_rank import Rank

ROOT = Path(__file__).resolve().parents[3]
GROUP_CONTROLS = {"node_ids", "wait_idle"}  # LearnerGroup's own, not the worker's


def public_methods(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("handle", "worker", "elsewhere"),
    [
        (RolloutHandle, RolloutWorker, set()),
        (LearnerHandle, LearnerWorker, {"node_id"}),  # per rank: LearnerRank
    ],
)
def test_a_handle_mirrors_its_worker(handle: type, worker: type, elsewhere: set[str]) -> None:
    assert public_methods(worker) - elsewhere == methods(handle) - GROUP_CONTROLS
    for name in methods(handle) - GROUP_CONTROLS:
        assert str(inspect.signature(getattr(handle, name))) == str(
            inspect.signature(getattr(worker, name))
        ), f"{handle.__name__}.{name} and {worker.__name__}.{name} differ"
    for name in methods(handle) & GROUP_CONTROLS:
        assert str(inspect.signature(getattr(handle, name))) == str(
            inspect.signature(getattr(LearnerGroup, name))
        )
    assert str(inspect.signature(LearnerRank.node_id)) == str(
        inspect.signature(LearnerWorker.node_id)
    )


class RankHandle(Protocol):
    def where(self) -> str: ...

    def close(self) -> None: ...


@pytest.mark.integration
def test_a_handle_calls_the_worker_process_and_refuses_undeclared_names() -> None:
    actor = ProcessActor(Rank, 0, name="rank-0")
    rank = typed(actor, RankHandle)
    try:
        assert rank.where() == f"rank 0 in pid {actor.process.pid}"
        with pytest.raises(AttributeError, match="RankHandle has no method 'step'"):
            rank.step  # noqa: B018 (declared nowhere: fails here, nothing sent)
        assert rank.where().startswith("rank 0")  # and the actor still answers
    finally:
        rank.close()  # the actor's own close: the process stops
    assert not actor.process.is_alive()


@pytest.mark.integration
def test_a_learner_handle_fans_out_and_its_controls_run_on_the_group() -> None:
    group = LearnerGroup([ProcessActor(Rank, r, name=f"learner-{r}") for r in range(2)])
    learners = typed(group, LearnerHandle)
    try:
        assert learners.node_ids() == ["node-0", "node-1"]  # each rank asked
        assert learners.wait_idle(timeout_s=5)
    finally:
        learners.close()
    assert not any(rank.process.is_alive() for rank in group.ranks)


@pytest.mark.unit
def test_no_method_name_travels_as_a_string_outside_the_handles() -> None:
    allowed = {"core/runtime/handles.py", "core/runtime/actors.py", "core/runtime/placement.py"}
    found = []
    for top in ("core", "tasks", "flows", "experiments"):
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text(encoding="utf-8")
            if rel not in allowed and re.search(r"\.call(_async)?\(\s*[\"']", text):
                found.append(rel)
    assert not found, f"use the typed handles (core/runtime/handles.py) in {found}"
