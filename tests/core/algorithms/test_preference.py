"""SFT, DPO/IPO and Bradley-Terry reward-model losses."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import dpo_loss, reward_model_loss, sft_loss

pytestmark = pytest.mark.unit


def test_sft_loss():
    logprobs = torch.tensor([[-1.0, -3.0, -9.0], [-2.0, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss = sft_loss(logprobs, mask)
    assert loss.item() == pytest.approx((1 + 3 + 2) / 3)
    loss.backward()
    assert torch.allclose(logprobs.grad, -mask.float() / 3)
    seq = sft_loss(logprobs, mask, aggregation="seq-mean-token-mean")
    assert seq.item() == pytest.approx((2 + 2) / 2)


def test_dpo_hand_cases():
    chosen, rejected = torch.tensor([-1.0]), torch.tensor([-1.0])
    loss, stats = dpo_loss(chosen, rejected, chosen, rejected, beta=0.1)
    assert loss.item() == pytest.approx(math.log(2))
    assert stats["reward_accuracy"].item() == 0.0
    policy_c = torch.tensor([-1.0], requires_grad=True)
    loss, stats = dpo_loss(policy_c, torch.tensor([-3.0]), torch.tensor([-2.0]),
                           torch.tensor([-2.0]), beta=0.5)  # fmt: skip
    h = (-1.0 + 2.0) - (-3.0 + 2.0)  # 2
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.5 * h))))
    assert stats["chosen_reward"].item() == pytest.approx(0.5)
    assert stats["rejected_reward"].item() == pytest.approx(-0.5)
    assert stats["reward_margin"].item() == pytest.approx(1.0)
    loss.backward()  # d/dlogp_c -log σ(βh) = -β σ(-βh)
    assert policy_c.grad.item() == pytest.approx(-0.5 / (1 + math.exp(0.5 * h)))
    loss, _ = dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
                       torch.tensor([-2.0]), beta=0.5, kind="ipo")  # fmt: skip
    assert loss.item() == pytest.approx((h - 1 / (2 * 0.5)) ** 2)
    with pytest.raises(ValueError, match="kind"):
        dpo_loss(chosen, rejected, chosen, rejected, kind="hinge")


def test_reward_model_loss():
    loss, stats = reward_model_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]))
    expected = (math.log(1 + math.exp(-1.0)) + math.log(2)) / 2
    assert loss.item() == pytest.approx(expected)
    assert stats["accuracy"].item() == 0.5
    assert stats["margin"].item() == pytest.approx(0.5)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), pairs=st.integers(1, 8), beta=st.floats(0.01, 2.0),
       kind=st.sampled_from(["sigmoid", "ipo"]), split=st.integers(0, 8))  # fmt: skip
def test_dpo_reference_and_split(seed, pairs, beta, kind, split):
    gen = torch.Generator().manual_seed(seed)
    pc, pr, rc, rr = (-torch.rand(pairs, generator=gen, dtype=torch.float64) * 5 for _ in range(4))
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, kind)
    total = 0.0
    for i in range(pairs):
        h = float((pc[i] - rc[i]) - (pr[i] - rr[i]))
        if kind == "sigmoid":
            total += math.log1p(math.exp(-beta * h))
        else:
            total += (h - 1 / (2 * beta)) ** 2
    assert loss.item() == pytest.approx(total / pairs, rel=1e-9, abs=1e-12)
    k = min(split, pairs)
    parts = [slice(0, k), slice(k, pairs)]
    summed = sum(dpo_loss(pc[s], pr[s], rc[s], rr[s], beta, kind, normalizer=pairs)[0]
                 for s in parts)  # fmt: skip
    assert summed.item() == pytest.approx(loss.item(), rel=1e-9, abs=1e-12)
