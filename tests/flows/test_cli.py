"""The `asyncrl` command line: config errors exit 2 before work starts; `run` writes a summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
runner = CliRunner()

SMALL = ["data.n_train=200", "data.n_test=40", "eval.n_problems=40", "eval.max_new_tokens=8"]


@pytest.mark.unit
def test_unknown_key_exits_2_naming_the_key(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", QUICKSTART, "rollout.max_stalenes=3", f"cluster.fileroot={tmp_path}"])
    assert result.exit_code == 2
    assert "rollout.max_stalenes" in result.output and "rollout.max_staleness" in result.output
    assert not any(tmp_path.iterdir())  # nothing was started or written


@pytest.mark.unit
def test_wrong_type_exits_2_naming_key_and_type() -> None:
    result = runner.invoke(app, ["config", "show", QUICKSTART, "eval.batch_size=many"])
    assert result.exit_code == 2
    assert "eval.batch_size" in result.output and "int" in result.output


@pytest.mark.unit
def test_config_show_prints_resolved_values() -> None:
    result = runner.invoke(app, ["config", "show", QUICKSTART, "rollout.max_staleness=0", "algorithm=dapo"])
    assert result.exit_code == 0, result.output
    assert "max_staleness: 0" in result.output
    assert "name: dapo" in result.output


@pytest.mark.unit
def test_config_docs_lists_every_field() -> None:
    result = runner.invoke(app, ["config", "docs"])
    assert result.exit_code == 0
    assert "`rollout.max_staleness`" in result.output
    assert "`algorithm.eps_clip`" in result.output


@pytest.mark.e2e
def test_run_main_job_writes_summary(tmp_path: Path) -> None:
    """The real console script in a subprocess, as a user runs it."""
    exe = Path(sys.executable).parent / "asyncrl"
    proc = subprocess.run(
        [str(exe), "run", QUICKSTART, f"cluster.fileroot={tmp_path}", "experiment.trial=t", *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accuracy before" in proc.stdout
    run_dir = tmp_path / "quickstart" / "t"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_before"]["n"] == 40
    assert 0.0 <= summary["accuracy_before"] <= 1.0
    assert summary["data"]["n_train"] == 200
    assert (run_dir / "config.yaml").exists()
    assert (run_dir / "model_init" / "config.json").exists()
    assert len((run_dir / "data" / "test.jsonl").read_text().splitlines()) == 40
