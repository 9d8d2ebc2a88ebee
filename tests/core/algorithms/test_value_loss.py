"""Clipped value loss (PPO2)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import AGGREGATION_MODES, aggregate_loss, global_normalizer, value_loss

pytestmark = pytest.mark.unit


def test_hand_case():
    values = torch.tensor([[1.0, 0.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = value_loss(values, old, returns, mask, value_clip=0.2)
    # token 0: unclipped 1, clipped (0.2)^2 = 0.04 -> 1; token 1: both 1 -> 1
    assert loss.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    loss.backward()
    assert torch.allclose(values.grad, torch.tensor([[0.5, -0.5, 0.0]]))
    assert stats["value_clip_frac"].item() == 0.0

    values = torch.tensor([[1.0]], requires_grad=True)
    loss, stats = value_loss(values, torch.zeros(1, 1), torch.tensor([[3.0]]), torch.ones(1, 1))
    # clipped value 0.2 -> (2.8)^2 = 7.84 > (2)^2 = 4: clipped branch, no gradient
    assert loss.item() == pytest.approx(0.5 * 7.84)
    loss.backward()
    assert values.grad.item() == 0.0
    assert stats["value_clip_frac"].item() == 1.0


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 5),
    tokens=st.integers(1, 6),
    clip=st.sampled_from([None, 0.1, 0.5]),
    mode=st.sampled_from(AGGREGATION_MODES),
)
def test_matches_reference(seed, batch, tokens, clip, mode):
    gen = torch.Generator().manual_seed(seed)
    values, old, returns = torch.randn(3, batch, tokens, generator=gen, dtype=torch.float64)
    mask = torch.rand(batch, tokens, generator=gen) < 0.7
    loss, _ = value_loss(values, old, returns, mask, value_clip=clip, aggregation=mode)
    per_token = torch.zeros_like(values)
    for i in range(batch):
        for t in range(tokens):
            v, o, r = float(values[i, t]), float(old[i, t]), float(returns[i, t])
            err = (v - r) ** 2
            if clip is not None:
                v_clip = o + min(max(v - o, -clip), clip)
                err = max(err, (v_clip - r) ** 2)
            per_token[i, t] = 0.5 * err
    expected = aggregate_loss(per_token, mask, mode, normalizer=global_normalizer(mask, mode))
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
