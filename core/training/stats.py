"""Combine per-micro-batch loss statistics into one dict per optimiser step, over all ranks.

Loss functions report means over one micro-batch's loss tokens. Weighting each by its token
count and dividing by the total gives the mean over every loss token of the step, on every rank.
Keys ending in ``_max``/``_min`` are reduced with max/min instead, and keys ending in ``_loss``
(parts of the loss, already divided by the global normaliser) are summed like the loss itself.
Every rank must add the same keys (they are reduced in sorted order, one collective per kind).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import torch

from core.training.distributed import all_reduce_max, all_reduce_sum

Tensor = torch.Tensor


class StatsAccumulator:
    """Token-weighted means, sums (``*_loss``) and maxima/minima of scalar statistics."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)
        self._extrema: dict[str, list[float]] = defaultdict(list)

    def add(self, stats: Mapping[str, Tensor | float], weight: float) -> None:
        for key, value in stats.items():
            value = float(value)
            if key.endswith(("_max", "_min")):
                if weight > 0:  # a micro-batch without loss tokens has no meaningful extremum
                    self._extrema[key].append(value)
                else:
                    self._extrema.setdefault(key, [])
            elif key.endswith("_loss"):
                self._sums[key] += value
                self._weights[key] = 1.0  # summed over ranks to R; undone in reduce()
            else:
                self._sums[key] += value * weight
                self._weights[key] += weight

    def reduce(self) -> dict[str, float]:
        """The step's statistics, identical on every rank (collective when distributed)."""
        out: dict[str, float] = {}
        means = sorted(self._sums)
        if means:
            packed = torch.tensor(
                [self._sums[k] for k in means] + [self._weights[k] for k in means],
                dtype=torch.float64,
            )
            packed = all_reduce_sum(packed)
            sums, weights = packed[: len(means)], packed[len(means) :]
            for key, total, weight in zip(means, sums.tolist(), weights.tolist(), strict=True):
                if key.endswith("_loss"):
                    out[key] = total
                else:
                    out[key] = total / weight if weight > 0 else 0.0
        extrema = sorted(self._extrema)
        if extrema:
            # max(-x) = -min(x): one MAX collective serves both kinds; -inf marks "no value".
            signs = [1.0 if k.endswith("_max") else -1.0 for k in extrema]
            local = [
                max((s * v for v in self._extrema[k]), default=float("-inf"))
                for k, s in zip(extrema, signs, strict=True)
            ]
            reduced = all_reduce_max(torch.tensor(local, dtype=torch.float64)).tolist()
            for key, sign, value in zip(extrema, signs, reduced, strict=True):
                out[key] = sign * value if value != float("-inf") else 0.0
        return out
