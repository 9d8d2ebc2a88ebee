"""reasoning-gym end to end: generated tasks → tiny model → SFT → 2 RL steps, the package's scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.core.workflows.helpers import flow_run

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "reasoning_gym.yaml"
SMALL = [
    "data.n_train=64",
    "data.n_test=8",
    "sft.steps=10",
    "rollout.batch_size=2",
    "algorithm.group_size=2",
    "learner.total_steps=2",
    "eval.every_n_steps=0",
]


@pytest.mark.e2e
def test_rl_on_reasoning_gym_tasks_runs_and_is_scored_by_their_verifiers(
    harness: str, tmp_path: Path
) -> None:
    _, summary = flow_run(RECIPE, tmp_path, SMALL)  # through the Prefect flow, checked in MLflow
    run_dir = tmp_path / "reasoning_gym" / "t"
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == [0, 1]
    rewards = [r for b in batches for group in b["rewards"] for r in group]
    assert len(rewards) == 2 * 2 * 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert [e["n"] for e in summary["evals"]] == [8, 8]
    example = summary["evals"][-1]["examples"][0]
    assert json.loads(example["reference"])["task"] in {"chain_sum", "leg_counting"}
