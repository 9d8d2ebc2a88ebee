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
