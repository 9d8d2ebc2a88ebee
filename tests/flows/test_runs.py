"""``asyncrl runs``: the runs under a fileroot with their state, step, accuracy and links."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.config import load_config
from core.runtime.job import run_experiment
from core.runtime.run_lock import RunLock
from core.runtime.runs import list_runs
from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
TINY = ["data.n_train=60", "data.n_test=8", "eval.n_problems=8", "eval.max_new_tokens=8",
        "sft.enabled=false", "rollout.batch_size=2", "algorithm.group_size=2",
        "sampling.max_new_tokens=8", "eval.every_n_steps=0", "checkpoint.every_n_steps=0"]  # fmt: skip


@pytest.mark.e2e
def test_runs_lists_finished_running_and_stopped_runs(tmp_path: Path) -> None:
    run_experiment(load_config(QUICKSTART, [*TINY, f"cluster.fileroot={tmp_path}",
                                            "experiment.trial=done", "learner.total_steps=2"]))  # fmt: skip
    stopped = tmp_path / "quickstart" / "killed"
    stopped.mkdir(parents=True)
    (stopped / "config.yaml").write_text("{}")
    rows = [{"step": s, "reward/mean": 0.1} for s in range(3)] + [
        {"step": 2, "eval/accuracy": 0.25}
    ]
    (stopped / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    busy = tmp_path / "other" / "busy"
    busy.mkdir(parents=True)
    (busy / "config.yaml").write_text("{}")
    (tmp_path / "quickstart" / "_cache").mkdir(exist_ok=True)  # not a run

    with RunLock(str(busy)) as lock:
        runs = {run.trial: run for run in list_runs(str(tmp_path))}
        result = CliRunner().invoke(
            app, ["runs", "--fileroot", str(tmp_path)], env={"COLUMNS": "200"}
        )
    assert sorted(runs) == ["busy", "done", "killed"]
    assert (runs["done"].state, runs["done"].step, runs["done"].checkpoint) == ("finished", 2, 2)
    assert runs["done"].accuracy is not None
    assert (runs["killed"].state, runs["killed"].step, runs["killed"].accuracy) == (
        "stopped",
        3,
        0.25,
    )
    assert runs["busy"].state == "running" and runs["busy"].owner == lock.record["owner"]
    assert result.exit_code == 0, result.output
    for word in ("done", "finished", "killed", "stopped", "busy", "running", "v2"):
        assert word in result.output
    # once the job is gone, its folder is no longer running
    assert {run.trial: run.state for run in list_runs(str(tmp_path), "other")} == {
        "busy": "stopped"
    }


def test_runs_on_an_empty_fileroot_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["runs", "--fileroot", str(tmp_path)])
    assert result.exit_code == 1 and "no runs under" in result.output
