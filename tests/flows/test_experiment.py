"""flows.experiment's summary artifact: the MLflow run as a link when a tracking server has it."""

from __future__ import annotations

from typing import Any

import pytest

from flows.experiment import summary_markdown
from tasks.mlflow_tracking import run_url

pytestmark = pytest.mark.unit

SUMMARY: dict[str, Any] = {
    "experiment": "quickstart", "trial": "t1", "algorithm": "grpo", "max_staleness": 4,
    "data": {"n_test": 40}, "accuracy_before": 0.35, "accuracy_after": 0.44, "steps": 2,
    "wall_seconds": 12.5, "checkpoint_url": "runs/quickstart/t1/checkpoints",
    "run_dir": "runs/quickstart/t1",
}  # fmt: skip


def test_the_run_links_to_the_mlflow_ui_of_a_tracking_server() -> None:
    url = run_url("http://127.0.0.1:5000/", "7", "abc123")
    assert url == "http://127.0.0.1:5000/#/experiments/7/runs/abc123"
    markdown = summary_markdown(SUMMARY, "abc123", url)
    assert f"| MLflow run | [abc123]({url}) |" in markdown.splitlines()


def test_the_run_id_stays_plain_for_an_embedded_store() -> None:
    url = run_url("sqlite:////tmp/runs/mlflow.db", "7", "abc123")
    assert url is None
    lines = summary_markdown(SUMMARY, "abc123", url).splitlines()
    assert "| MLflow run | abc123 |" in lines
    assert "| accuracy after RL | 0.440 |" in lines
