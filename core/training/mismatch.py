"""Train/inference mismatch: the engine's recorded log-prob of a trained token against the
learner's recomputation under the same weights.

For a token generated at the learner's current version, the engine sampled it from the very
weights the learner holds before its update, so ``log π_learner(y_t) − log π_engine(y_t)`` must
be ~0 (fp32 on CPU: the arithmetic differs only in summation order). A gap there is a bug that
looks like noise: a re-tokenised template, a wrong mask or version, a sampling setting the
learner does not apply (a per-call temperature, a penalty, top-p), in-flight weight updates on
a kept KV cache (``inference.kv_after_update=keep``: the engine's log-prob mixes old keys with
new weights, by design), or low-precision kernels on GPU. Peers log the same quantity (verl's
rollout-correction metrics, slime's train/rollout log-prob difference, TRL's vLLM importance
sampling correction).

:class:`MismatchMonitor` is fed by the policy loss with every micro-batch's learner log-probs
(exact ones only: π_prox recomputed, or the training pass of the update's only optimiser step)
and summarises one update: see :meth:`MismatchMonitor.summary` for the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from core.training.batch import TrainBatch

Tensor = torch.Tensor

# The batch field that numbers each row in the driver's batch (survives sharding and micro-batching).
ROW_FIELD = "row"


@dataclass
class WorstToken:
    """Where the largest absolute difference of an update was."""

    abs_diff: float = 0.0
    row: int = -1  # the row in the driver's batch
    position: int = -1  # the token's index in that row's sequence
    engine_logprob: float = 0.0
    learner_logprob: float = 0.0
    version: int = -1


@dataclass
class MismatchMonitor:
    """Accumulates one update's mismatch statistics over micro-batches (and ranks).

    Args:
        version: the learner's version at the start of the update; only tokens generated at it
            are compared (older ones come from other weights: that gap is staleness, not
            mismatch).
        tolerance: a token counts as mismatched above this absolute log-prob difference.
    """

    version: int
    tolerance: float
    tokens: int = 0
    above: int = 0
    abs_sum: float = 0.0
    later_tokens: int = 0  # tokens of a row's second and later generation calls (agent turns)
    later_abs_sum: float = 0.0
    row_log_ratio: dict[int, float] = field(default_factory=dict)
    worst: WorstToken = field(default_factory=WorstToken)

    def add(self, micro: TrainBatch, learner_logprobs: Tensor) -> None:
        """Compare ``learner_logprobs`` ``[n, t]`` (no grad) with the micro-batch's behaviour
        log-probs on its tokens generated at :attr:`version`."""
        current = (micro.loss_mask != 0) & (micro.versions == self.version)
        if not bool(current.any()):
            return
        diff = (learner_logprobs.detach().float() - micro.behaviour_logprobs.float()).cpu()
        current = current.cpu()
        absolute = torch.where(current, diff.abs(), 0.0)
        self.tokens += int(current.sum())
        self.above += int((absolute > self.tolerance).sum())
        self.abs_sum += float(absolute.sum())
        later = current & (generation_call_index(micro.loss_mask.cpu()) > 0)
        self.later_tokens += int(later.sum())
        self.later_abs_sum += float(torch.where(later, absolute, 0.0).sum())
        rows = micro[ROW_FIELD].tolist() if ROW_FIELD in micro else list(range(len(micro)))
        sums = torch.where(current, diff, 0.0).sum(dim=1)
        for i in torch.nonzero(current.any(dim=1)).flatten().tolist():
            self.row_log_ratio[rows[i]] = self.row_log_ratio.get(rows[i], 0.0) + float(sums[i])
        value, flat = absolute.flatten().max(dim=0)
        if float(value) > self.worst.abs_diff:
            i, t = divmod(int(flat), absolute.shape[1])
            self.worst = WorstToken(
                float(value),
                rows[i],
                t,
                float(micro.behaviour_logprobs[i, t]),
                float(learner_logprobs[i, t]),
                int(micro.versions[i, t]),
            )

    def merge(self, other: MismatchMonitor) -> None:
        """Add another rank's statistics (rows are disjoint across ranks)."""
        self.tokens += other.tokens
        self.above += other.above
        self.abs_sum += other.abs_sum
        self.later_tokens += other.later_tokens
        self.later_abs_sum += other.later_abs_sum
        for row, value in other.row_log_ratio.items():
            self.row_log_ratio[row] = self.row_log_ratio.get(row, 0.0) + value
        if other.worst.abs_diff > self.worst.abs_diff:
            self.worst = other.worst

    def summary(self) -> dict[str, Any]:
        """The update's metrics (``mismatch/…``), all 0 when no token was at the version:

        ``tokens`` checked; ``abs_mean`` / ``abs_max`` of ``|log π_learner − log π_engine|``;
        ``frac_above_tol`` the share above the tolerance; ``seq_log_ratio_mean`` /
        ``seq_log_ratio_abs_max`` the per-row sum of the differences (the log of the
        sequence-level ratio π_learner/π_engine over its checked tokens); ``later_calls_abs_mean``
        the mean over the second and later generation calls of a row (agent turns after the
        first, where a re-tokenised template shows); and ``worst`` (not a metric) the location
        of the largest difference."""
        ratios = list(self.row_log_ratio.values())
        return {
            "mismatch/tokens": float(self.tokens),
            "mismatch/abs_mean": self.abs_sum / self.tokens if self.tokens else 0.0,
            "mismatch/abs_max": self.worst.abs_diff,
            "mismatch/frac_above_tol": self.above / self.tokens if self.tokens else 0.0,
            "mismatch/seq_log_ratio_mean": sum(ratios) / len(ratios) if ratios else 0.0,
            "mismatch/seq_log_ratio_abs_max": max(map(abs, ratios), default=0.0),
            "mismatch/later_calls_abs_mean": (
                self.later_abs_sum / self.later_tokens if self.later_tokens else 0.0
            ),
            "worst": self.worst,
        }


def generation_call_index(loss_mask: Tensor) -> Tensor:
    """``[N, T]`` int: on generated tokens, which run of consecutive generated tokens of its row
    (0 = the first generation call; an agent's calls are separated by context tokens) it is
    in; -1 elsewhere."""
    generated = loss_mask != 0
    previous = torch.zeros_like(generated)
    previous[:, 1:] = generated[:, :-1]
    starts = generated & ~previous
    index = torch.cumsum(starts.long(), dim=1) - 1
    return torch.where(generated, index, -1)
