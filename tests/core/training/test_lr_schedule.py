"""Warmup + cosine LR schedule."""

from __future__ import annotations

import math

import pytest
import torch

from core.training import WarmupCosine, warmup_cosine_schedule

pytestmark = pytest.mark.unit


def _lrs(warmup: int, total: int, ratio: float, steps: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = warmup_cosine_schedule(
        optimizer, warmup_steps=warmup, total_steps=total, min_lr_ratio=ratio
    )
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])  # the lr this optimiser step uses
        optimizer.step()
        scheduler.step()
    return lrs


def test_warmup_is_linear_then_cosine_to_min_ratio() -> None:
    lrs = _lrs(warmup=4, total=14, ratio=0.1, steps=20)
    assert lrs[:5] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])  # linear, peak at step 4
    assert lrs[9] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))  # half-way through the cosine
    assert lrs[14:] == pytest.approx([0.2] * 6)  # min_lr_ratio from total_steps on
    decay = lrs[4:15]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    expected = [2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 10))) for k in range(11)]
    assert decay == pytest.approx(expected)


def test_no_warmup_and_validation() -> None:
    assert _lrs(warmup=0, total=4, ratio=0.0, steps=5) == pytest.approx(
        [2.0, 1.70710678, 1.0, 0.29289322, 0.0]
    )
    with pytest.raises(ValueError, match="min_lr_ratio"):
        WarmupCosine(1, 10, 1.5)
    with pytest.raises(ValueError, match="total_steps"):
        WarmupCosine(1, 0)
