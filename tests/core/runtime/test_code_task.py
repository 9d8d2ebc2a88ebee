"""The code task end to end: synthetic problems → tiny model → SFT → 2 RL steps on sandboxed tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from core.config import load_config
from core.runtime.job import run_experiment

ROOT = Path(__file__).resolve().parents[3]
CODE_QUICKSTART = ROOT / "experiments" / "code_quickstart.yaml"
TINY = [
    "data.n_train=40",
    "data.n_test=8",
    "data.code_synthetic.families=[plus,minus]",
    "data.code_synthetic.max_constant=3",
    "sft.steps=150",  # enough for "def h(x):\n    return x - 2" and some right constants
    "sft.batch_size=16",
    "sft.lr=5e-3",
    "sft.warmup_steps=5",
    "rollout.batch_size=4",
    "algorithm.group_size=2",
    "sampling.max_new_tokens=16",
    "rollout.max_concurrent=8",
    "rollout.reward_fn=core.rewards.code:tests_passed_fraction",
    "rollout.reward_workers=0",  # inline: in a worker thread, off the rollout's event loop
    "learner.total_steps=2",
    "eval.n_problems=8",
    "eval.max_new_tokens=16",
    "eval.every_n_steps=0",
    "checkpoint.every_n_steps=0",
]


@pytest.mark.e2e
def test_rl_on_the_code_task_scores_completions_in_the_sandbox(tmp_path: Path) -> None:
    cfg = load_config(
        CODE_QUICKSTART, [*TINY, f"cluster.fileroot={tmp_path}", "experiment.trial=t"]
    )
    summary = run_experiment(cfg)
    run_dir = tmp_path / "code_quickstart" / "t"
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == [0, 1]
    rewards = [r for b in batches for group in b["rewards"] for r in group]
    assert len(rewards) == 2 * 4 * 2
    assert all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in rewards)
    assert all(r * 3 == pytest.approx(round(r * 3)) for r in rewards)  # passed / 3 tests
    evals = summary["evals"]
    assert [e["n"] for e in evals] == [8, 8]
    assert all(e["metrics"]["compiles"] >= 0.5 for e in evals)  # code, not noise, after SFT
    # A test can only pass in the sandbox: some completion passed one.
    assert max([*rewards, *(e["accuracy"] for e in evals)]) > 0
    completion = evals[-1]["examples"][0]["completion"]
    assert completion.startswith("def ") and "return" in completion
