"""Where the train loop sends its numbers. ``core`` knows only this small interface; the Prefect
tasks bind an MLflow sink to it (``tasks/``), the pipeline ``metrics.jsonl`` and TensorBoard's
(:mod:`core.runtime.tensorboard`), tests a list."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from core.rollout.api import Group, episode_metrics

logger = logging.getLogger(__name__)


class MetricSink(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...


def finite_numbers(metrics: Mapping[str, object]) -> dict[str, float]:
    """The values that are finite numbers, as floats; None, NaN, inf, bools and the rest dropped.

    What the MLflow and TensorBoard sinks record (``metrics.jsonl`` keeps the rest as null).
    """
    return {
        key: float(value)
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def rollout_metrics(
    engine_before: Mapping[str, float] | None, after: Mapping[str, object], wall_s: float
) -> dict[str, float]:
    """The rollout side over one step, from the worker's ``stats`` at its start and end: groups
    in flight and, on the in-process engine (``engine`` counters), the share of the step its model
    was busy, the prompt tokens it prefilled (re-prefills included) or took from its prefix
    cache, and the rows a decode step had on average. Failed and timed-out episodes are counts
    since the run started."""
    out = {
        "rollout/groups_in_flight": float(after["running"]),  # type: ignore[arg-type]
        "rollout/episodes_failed": float(after.get("episodes_failed", 0)),  # type: ignore[arg-type]
        "rollout/episodes_timed_out": float(after.get("episodes_timed_out", 0)),  # type: ignore[arg-type]
    }
    engine = after.get("engine")
    if not isinstance(engine, Mapping) or engine_before is None:
        return out
    d = {key: float(engine[key]) - float(engine_before[key]) for key in engine_before
         if isinstance(engine_before[key], int | float)}  # fmt: skip
    out.update({
        "rollout/engine_busy_frac": (d["prefill_s"] + d["decode_s"]) / wall_s if wall_s else 0.0,
        "rollout/prefill_tokens": d["prefill_tokens"],
        "rollout/reprefilled_tokens": d["reprefilled_tokens"],
        "rollout/prefix_cached_tokens": d["prefix_cached_tokens"],
        "rollout/decode_rows_per_step": (
            d["tokens_generated"] / d["decode_steps"] if d["decode_steps"] else 0.0
        ),
    })  # fmt: skip
    return out


@dataclass(frozen=True)
class StepTimes:
    """Where one RL step's seconds went (the learner's busy fraction is ``train_s / step_s``)."""

    wait_s: float  # waiting for the batch (``prepare_batch``)
    train_s: float  # the learner: critic/reference passes, advantages, the policy update
    publish_s: float  # the new weights into the engines
    step_s: float  # all of it


def staleness(groups: Sequence[Group], step: int) -> list[int]:
    """Per group, how many versions older than ``step`` its oldest token is."""
    return [step - g.oldest_version for g in groups]


def interrupted_episodes(groups: Sequence[Group]) -> int:
    """Episodes with a row that a weight update interrupted (and that resumed after it)."""
    return sum(
        len({e for e, t in zip(g.episode_of, g.trajectories, strict=True)
             if t.metadata.get("n_resumes", 0) > 0})
        for g in groups
    )  # fmt: skip


def step_metrics(
    step: int,
    groups: Sequence[Group],
    n_tokens: int,
    stats: Mapping[str, float],
    times: StepTimes,
) -> dict[str, float]:
    """One RL step's rewards, staleness, throughput and time split, and the learner's
    ``actor/``/``critic/`` stats. A sample is an episode, however many rows it trains;
    ``n_tokens`` are the trained (loss-masked) tokens."""
    rewards = torch.tensor([r for g in groups for r in g.rewards])
    n_episodes = len(rewards)
    lags = staleness(groups, step)
    token_versions = [  # per generated token: a trajectory resumed after an update mixes versions
        v
        for g in groups
        for t in g.trajectories
        for v, m in zip(t.versions, t.loss_mask, strict=True)
        if m
    ]
    wall = times.step_s
    return {
        "reward/mean": float(rewards.mean()),
        "reward/accuracy": float((rewards > 0.5).float().mean()),
        "staleness/mean": float(np.mean(lags)),
        "staleness/max": float(max(lags)),
        "staleness/token_mean": step - float(np.mean(token_versions)) if token_versions else 0.0,
        "staleness/interrupted_frac": interrupted_episodes(groups) / n_episodes,
        "throughput/samples_per_s": n_episodes / wall,
        "throughput/tokens_per_s": n_tokens / wall,
        "time/wait_rollout_s": times.wait_s,
        "time/train_s": times.train_s,
        "time/publish_s": times.publish_s,
        "time/step_s": wall,
        "learner/busy_fraction": times.train_s / wall,
        "response/mean_tokens": n_tokens / n_episodes,  # per episode
        **{k: v for k, v in stats.items() if k.startswith(("actor/", "critic/"))},
    }


class MemorySink:
    """Keeps every logged row (the summary and tests read it)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append({"step": step, **metrics})

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(int(r["step"]), r[key]) for r in self.rows if key in r]


class JsonlSink:
    """One JSON line per ``log_metrics`` call, appended to a local file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        clean = {
            k: (v if isinstance(v, int | float) and math.isfinite(v) else None)
            for k, v in metrics.items()
        }
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")


class FanOut:
    """Send every row to several sinks."""

    def __init__(self, sinks: Iterable[MetricSink]) -> None:
        self.sinks = list(sinks)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log_metrics(metrics, step)


def agent_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """``agent/tool_call_share`` (episodes that called a tool at least once) and
    ``agent/tool_calls_mean`` over the batch's episodes, where the workflow counts tool calls
    (``tool_calls`` in the trajectory metadata: the OpenAI-shaped agents' tool loop), and
    ``agent/<name>``: the mean of each ``metric/<name>`` the episodes report."""
    last = [g.trajectories[rows[-1]].metadata for g in groups for rows in _episode_rows(g)]
    reported = {f"agent/{name}": value for name, value in episode_metrics(last).items()}
    calls = [int(meta["tool_calls"]) for meta in last if "tool_calls" in meta]
    if not calls:
        return reported
    return {
        "agent/tool_call_share": sum(c > 0 for c in calls) / len(calls),
        "agent/tool_calls_mean": sum(calls) / len(calls),
        **reported,
    }


def _episode_rows(group: Group) -> list[list[int]]:
    rows: dict[int, list[int]] = {}
    for i, episode in enumerate(group.episode_of):
        rows.setdefault(episode, []).append(i)
    return list(rows.values())


_KEPT_KV = (
    "; expected with inference.kv_after_update=keep: tokens sampled after an in-flight weight "
    "update read keys the older weights computed (the behaviour weight corrects for it)"
)


def mismatch_metrics(
    stats: Mapping[str, float],
    groups: Sequence[Group],
    step: int,
    *,
    tolerance: float,
    warn_frac: float | None,
    kept_kv: bool = False,
) -> dict[str, float]:
    """The update's ``mismatch/…`` metrics from the learner's stats (none when the learner could
    not check: see core/training/mismatch.py), with a warning naming the worst token's sample,
    episode and position when more than ``warn_frac`` of the checked tokens is off by more than
    ``tolerance``. With ``kept_kv`` (``inference.kv_after_update=keep``) the warning says why a
    gap is expected there: a token sampled after an in-flight update read keys that the older
    weights computed, which the learner's recomputation does not."""
    metrics = {
        k: float(v)
        for k, v in stats.items()
        if k.startswith("mismatch/") and not k.startswith("mismatch/worst_")
    }
    frac = metrics.get("mismatch/frac_above_tol", 0.0)
    if warn_frac is None or frac <= warn_frac:
        return metrics
    row = int(stats["mismatch/worst_row"])
    rows = [(g.sample_id, e) for g in groups for e in g.episode_of]
    sample, episode = rows[row] if 0 <= row < len(rows) else ("?", -1)
    logger.warning(
        "step %d: train/inference mismatch on %.1f%% of %d tokens generated at the learner's "
        "version (|log-prob difference| > %g); worst %.4g at sample %s, episode %d, batch row "
        "%d, token %d (engine %.4f, learner %.4f, version %d)%s",
        step, 100 * frac, int(metrics["mismatch/tokens"]), tolerance,
        stats["mismatch/worst_abs_diff"], sample, episode, row,
        int(stats["mismatch/worst_position"]), stats["mismatch/worst_engine_logprob"],
        stats["mismatch/worst_learner_logprob"], int(stats["mismatch/worst_version"]),
        _KEPT_KV if kept_kv else "",
    )  # fmt: skip
    return metrics
