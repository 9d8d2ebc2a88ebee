"""KL estimators k1/k2/k3 (Schulman, "Approximating KL divergence")."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import kl_penalty

pytestmark = pytest.mark.unit


def test_hand_values():
    logprobs = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-2.0, -1.0])  # log r = ref - logp = [-1, 1]
    assert torch.allclose(kl_penalty(logprobs, ref, "k1"), torch.tensor([1.0, -1.0]))
    assert torch.allclose(kl_penalty(logprobs, ref, "k2"), torch.tensor([0.5, 0.5]))
    k3 = torch.tensor([math.exp(-1) - 1 + 1, math.exp(1) - 1 - 1])
    assert torch.allclose(kl_penalty(logprobs, ref, "k3"), k3)
    assert torch.all(kl_penalty(logprobs, logprobs, "k3") == 0)
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(logprobs, ref, "k4")


@settings(max_examples=50, deadline=None)
@given(
    x=st.lists(st.floats(-30, 0, allow_nan=False), min_size=1, max_size=16),
    y=st.lists(st.floats(-30, 0, allow_nan=False), min_size=16, max_size=16),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_k3_and_k2_nonnegative(x, y, dtype):
    logprobs = torch.tensor(x, dtype=dtype)
    ref = torch.tensor(y[: len(x)], dtype=dtype)
    assert torch.all(kl_penalty(logprobs, ref, "k3") >= 0)
    assert torch.all(kl_penalty(logprobs, ref, "k2") >= 0)


def test_k1_and_k3_are_unbiased_for_kl():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), -1)
    exact = float((p * (p / q).log()).sum())
    samples = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, logq = p.log()[samples], q.log()[samples]
    for kind in ("k1", "k3"):
        assert kl_penalty(logp, logq, kind).mean().item() == pytest.approx(exact, rel=0.03)
    assert kl_penalty(logp, logq, "k3").std() < kl_penalty(logp, logq, "k1").std()


def test_k3_gradient_matches_analytic():
    logprobs = torch.tensor([-0.3, -2.0], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0])
    kl_penalty(logprobs, ref, "k3").sum().backward()
    # d/dlogp [(e^{ref-logp} - 1) - (ref - logp)] = 1 - e^{ref-logp}
    assert torch.allclose(logprobs.grad, 1 - torch.exp(ref - logprobs.detach()))


def test_k3_is_bounded_as_verl_bounds_it():
    """Issue 32 #6: one token 30 nats below the reference made k3 = e^30 (a loss of 1e13)."""
    logprobs = torch.tensor([-31.0, -1.0, -1.0], requires_grad=True)
    ref = torch.tensor([-1.0, -31.0, -1.0])  # log r = 30, -30, 0
    k3 = kl_penalty(logprobs, ref, "k3")
    assert k3.tolist() == pytest.approx([10.0, 10.0, 0.0])  # -30 would give 29: capped at 10
    k3.sum().backward()
    assert torch.isfinite(logprobs.grad).all()
