"""Helpers shared by the agent tests (imported as ``tests.core.workflows.helpers``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def trained_spans(tokenizer: Any, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded runs of consecutive trained tokens (``mask`` 1), in order."""
    spans, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    spans.append(tokenizer.decode(current))
    return spans


def two_step_run(recipe: Path, tmp_path: Path, *overrides: str) -> tuple[Path, dict[str, Any]]:
    """Run ``recipe`` for what :func:`two_trained_steps` checks (a 10-step SFT on 32 samples,
    2 RL steps of 2 prompts × 2 samples, 4 held out) under ``tmp_path``; (run dir, summary)."""
    from core.config import load_config  # the heavy imports only where a run is made
    from core.runtime.job import run_experiment

    config = load_config(recipe, [
        "data.n_train=32", "data.n_test=4", "sft.steps=10", "rollout.batch_size=2",
        "algorithm.group_size=2", "learner.total_steps=2", "eval.every_n_steps=0",
        f"cluster.fileroot={tmp_path}", "experiment.trial=t", *overrides,
    ])  # fmt: skip
    summary = run_experiment(config)
    return tmp_path / config.experiment.name / "t", summary


def two_trained_steps(run_dir: Path, summary: dict[str, Any], n_test: int) -> list[float]:
    """Check a run of 2 RL steps of 2 prompts × 2 samples: both steps trained, both evals held
    ``n_test`` problems, and the engine's log-probs through the agent's client equal the
    learner's (fp32) on the first step; returns the trained rewards."""
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == [0, 1]
    rewards = [r for b in batches for group in b["rewards"] for r in group]
    assert len(rewards) == 2 * 2 * 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert [e["n"] for e in summary["evals"]] == [n_test, n_test]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in metrics if "mismatch/tokens" in m)
    assert first["mismatch/tokens"] > 0 and first["mismatch/abs_max"] < 1e-3, first
    return rewards
