"""Reward shaping: bias/scale/clip, DAPO overlong penalty, KL in the reward."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import kl_penalized_rewards, overlong_penalty, shape_rewards

pytestmark = pytest.mark.unit


def test_shape_rewards_order_bias_scale_clip():
    rewards = torch.tensor([0.0, 1.0, 3.0])
    assert torch.allclose(
        shape_rewards(rewards, bias=-0.5, scale=2.0), torch.tensor([-1.0, 1.0, 5.0])
    )
    clipped = shape_rewards(rewards, bias=-0.5, scale=2.0, clip=2.0)
    assert torch.allclose(clipped, torch.tensor([-1.0, 1.0, 2.0]))
    assert torch.equal(shape_rewards(rewards), rewards)


def test_overlong_penalty_hand_case():
    lengths = torch.tensor([5, 6, 8, 10, 11])
    # L_max 10, L_cache 4: free up to 6, linear to -1 at 10, -1 beyond.
    expected = torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0])
    assert torch.allclose(overlong_penalty(lengths, 10, 4), expected)
    assert torch.allclose(overlong_penalty(lengths, 10, 4, penalty_factor=2.0), 2 * expected)
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, 10, 11)


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=20),
    max_len=st.integers(1, 256),
    data=st.data(),
)
def test_overlong_penalty_matches_dapo_piecewise(lengths, max_len, data):
    buffer_len = data.draw(st.integers(1, max_len))
    got = overlong_penalty(torch.tensor(lengths), max_len, buffer_len, penalty_factor=0.5)
    for n, g in zip(lengths, got.tolist(), strict=True):
        if n <= max_len - buffer_len:
            want = 0.0
        elif n <= max_len:
            want = ((max_len - buffer_len) - n) / buffer_len
        else:
            want = -1.0
        assert g == pytest.approx(0.5 * want, abs=1e-6)


def test_kl_penalized_rewards():
    mask = torch.tensor([[1, 1, 0]])
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    shaped = kl_penalized_rewards(torch.tensor([2.0]), logprobs, ref, mask, coef=0.1)
    # k1 = logp - ref = [0.5, -1.0]; outcome 2 on the last response token
    assert torch.allclose(shaped, torch.tensor([[-0.05, 2.0 + 0.1, 0.0]]))
    token_rewards = torch.tensor([[1.0, 1.0, 1.0]])
    shaped = kl_penalized_rewards(token_rewards, logprobs, ref, mask, coef=1.0, kind="k2")
    assert torch.allclose(shaped, torch.tensor([[1.0 - 0.125, 1.0 - 0.5, 0.0]]))
