"""Learning-rate schedule: linear warmup, then cosine decay to ``min_lr_ratio`` of the peak.

The factor for optimiser step ``s`` (0-based: the ``s``-th update uses it) is

* ``(s + 1) / warmup_steps`` while ``s < warmup_steps`` (the first update already moves; the
  ``warmup_steps``-th one runs at the peak);
* ``min_lr_ratio + (1 - min_lr_ratio) · ½ (1 + cos(π · p))`` after, with
  ``p = (s - warmup_steps) / (total_steps - warmup_steps)`` clipped to ``[0, 1]`` — the peak at
  the end of warmup, ``min_lr_ratio`` from ``total_steps`` on.

The factor is a small dataclass rather than a closure so that ``LambdaLR.state_dict()`` records
its settings in checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class WarmupCosine:
    """Callable LR factor of the module docstring."""

    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} must be >= 0 and total_steps={self.total_steps} >= 1"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min(max((step - self.warmup_steps) / span, 0.0), 1.0)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def warmup_cosine_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying ``WarmupCosine`` to every parameter group's initial lr."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(warmup_steps, total_steps, min_lr_ratio)
    )
