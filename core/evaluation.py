"""Held-out evaluation: the training workflow, decoding greedily, scored by the task reward.

Evals run the same workflow as training (so a tool agent's eval calls its tools) on the same
engine contract, with ``temperature = 0``. Greedy accuracy on a few hundred problems is noisy
(±3.5 points at n=200), so the result carries its standard error; a task adds its own metrics
(GSM8K: the share of answer-only completions) through its reward plug-in
(:func:`core.rewards.registry.with_completion_metrics`).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from core.inference.api import InferenceEngine
from core.rewards.registry import CompletionMetric
from core.rollout.api import Workflow


@dataclass
class EvalResult:
    """Accuracy on ``n`` held-out problems, the task's own metrics, and a few examples."""

    n: int
    accuracy: float
    stderr: float
    mean_new_tokens: float
    metrics: dict[str, float] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def evaluate_workflow(
    engine: InferenceEngine,
    workflow: Workflow,
    samples: Sequence[dict[str, Any]],
    *,
    max_new_tokens: int,
    max_concurrent: int,
    metrics: Mapping[str, CompletionMetric] | None = None,
    n_examples: int = 3,
    on_sample: Callable[[int], None] | None = None,
) -> EvalResult:
    """Greedy episodes of ``workflow`` on ``samples`` (dicts with ``question`` and ``answer``)."""
    if not samples:
        raise ValueError(
            "evaluation needs at least one held-out sample (eval.n_problems / data.n_test)"
        )
    greedy = copy.copy(workflow)
    greedy.sampling = dataclasses.replace(
        workflow.sampling, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens
    )
    slots = asyncio.Semaphore(max_concurrent)

    async def one(sample: dict[str, Any]) -> tuple[float, str, int]:
        async with slots:
            trajectory = await greedy.run_episode(engine, sample)
        if on_sample is not None:
            on_sample(1)
        if trajectory is None:  # a rejected episode scores nothing
            return 0.0, "", 0
        return trajectory.reward, trajectory.metadata.get("completion", ""), trajectory.n_generated

    results = await asyncio.gather(*(one(s) for s in samples))
    n = len(results)
    accuracy = sum(reward for reward, _, _ in results) / n
    return EvalResult(
        n=n,
        accuracy=accuracy,
        stderr=math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n),
        mean_new_tokens=sum(tokens for _, _, tokens in results) / n,
        metrics={
            name: sum(float(metric(text)) for _, text, _ in results) / n
            for name, metric in (metrics or {}).items()
        },
        examples=[
            {"question": s["question"], "completion": text, "reference": s["answer"], "reward": r}
            for s, (r, text, _) in list(zip(samples, results, strict=True))[:n_examples]
        ],
    )
