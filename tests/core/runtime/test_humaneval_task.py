"""HumanEval end to end: the package's problems → tiny model → SFT → 2 RL steps, tests in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.core.workflows.helpers import flow_run

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "humaneval.yaml"
SMALL = [
    "data.n_train=16",
    "data.n_test=4",
    "sft.steps=10",
    "rollout.batch_size=2",
    "algorithm.group_size=2",
    "sampling.max_new_tokens=24",
    "rollout.reward_workers=0",
    "learner.total_steps=2",
    "eval.n_problems=4",
    "eval.n_samples=2",
    "eval.max_new_tokens=24",
]


@pytest.mark.e2e
def test_rl_on_a_humaneval_split_runs_and_evaluates_held_out_problems(
    harness: str, tmp_path: Path
) -> None:
    _, summary = flow_run(RECIPE, tmp_path, SMALL)  # through the Prefect flow, checked in MLflow
    run_dir = tmp_path / "humaneval" / "t"
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == [0, 1]
    rewards = [r for b in batches for group in b["rewards"] for r in group]
    assert len(rewards) == 2 * 2 * 2 and set(rewards) <= {0.0, 1.0}
    evals = summary["evals"]
    assert [e["n"] for e in evals] == [4, 4]
    assert {"pass_at_1", "pass_at_2"} <= set(evals[-1]["sampled"])
    example = evals[-1]["examples"][0]
    assert example["question"].startswith(("from typing", "def ", "import"))
    assert json.loads(example["reference"])["entry_point"]
