"""Resume with η ≥ 1 is lossless: ``kill -9`` while a slow prompt is still in flight and later
prompts are already trained, then ``checkpoint.recover=auto``.

The killed run's first prompt is held back (tests/experiments/slow_workflows.py) until the
learner reaches version 3, so at the version-2 checkpoint it is in flight while the prompts drawn
after it have been trained. A resume must draw it again without training those later prompts a
second time, and must train every prompt the killed run drew but never trained.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from core.runtime.checkpointing import MARKER
from tests.core.runtime.test_trainer import TINY, _cli, _stderr, read_jsonl

STEPS = 6
CHECKPOINT = 2  # the version the kill follows


@pytest.mark.e2e
def test_kill_and_resume_with_eta_2_trains_each_draw_once(tmp_path: Path) -> None:
    # the CLI imports the test workflow by its path, from the repository root
    root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": path}
    run = tmp_path / "quickstart" / "async"
    args = [
        "--plain",  # the core loop alone: Prefect and MLflow have no part in resume
        *TINY,
        f"cluster.fileroot={tmp_path}",
        "experiment.trial=async",
        "rollout.workflow=tests.experiments.slow_workflows:FirstSampleSlowWorkflow",
        "rollout.max_staleness=2",
        "rollout.adaptive_staleness=false",  # the whole window of η=2 in use
        f"learner.total_steps={STEPS}",
        f"checkpoint.every_n_steps={CHECKPOINT}",
        "checkpoint.keep_last=3",
    ]
    first = _cli(args, env)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / f"step-{CHECKPOINT:06d}" / MARKER).exists():
        assert first.poll() is None, f"run ended before the kill: {_stderr(first)[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before_kill = read_jsonl(run / "batches.jsonl")
    second = _cli([*args, "checkpoint.recover=auto"], env)
    assert second.wait(timeout=300) == 0, _stderr(second)[-3000:]
    assert "resuming from" in _stderr(second)  # from step-000002: see the summary's steps

    rows = read_jsonl(run / "batches.jsonl")
    assert [row["step"] for row in rows] == list(range(STEPS))  # every step once
    trained = [sid for row in rows for sid in row["sample_ids"]]
    twice = {sid: n for sid, n in Counter(trained).items() if n > 1}
    # one epoch (120 prompts): no prompt may be trained twice
    assert not twice, f"{len(twice)} prompt(s) trained twice: {twice}"

    draws = read_jsonl(run / "draws.jsonl")
    pids = list(dict.fromkeys(d["pid"] for d in draws))
    assert len(pids) == 2, pids  # the killed run's rollout process, the resumed one's
    drawn_first = list(dict.fromkeys(d["id"] for d in draws if d["pid"] == pids[0]))
    drawn_again = {d["id"] for d in draws if d["pid"] == pids[1]}
    kept = {sid for row in before_kill if row["step"] < CHECKPOINT for sid in row["sample_ids"]}
    slow = drawn_first[0]
    assert slow not in kept  # the scenario: in flight at the checkpoint, later draws trained
    recover = json.loads(
        (run / "checkpoints" / f"step-{CHECKPOINT:06d}" / "recover.json").read_text()
    )
    assert len(recover["rollout"]["skip_draws"]) == len(kept)  # steps 0-1, all drawn after it
    untrained = [sid for sid in drawn_first if sid not in kept]
    assert set(untrained) <= drawn_again, "a draw outstanding at the kill was never redrawn"
    after = {sid for row in rows if row["step"] >= CHECKPOINT for sid in row["sample_ids"]}
    missing = [sid for sid in untrained if sid not in after]
    assert not missing, f"drawn before the kill, never trained: {missing}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["version"] == STEPS and summary["steps"] == STEPS - CHECKPOINT
