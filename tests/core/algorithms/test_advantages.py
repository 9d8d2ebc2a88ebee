"""Advantage estimators: GRPO, Dr.GRPO, RLOO, REINFORCE++(-baseline), GAE."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import (
    broadcast_to_tokens,
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    place_at_last_token,
    reinforce_pp_advantages,
    rloo_advantages,
)

pytestmark = pytest.mark.unit

SEEDS = st.integers(0, 2**31 - 1)
FAST = settings(max_examples=50, deadline=None)


def _rewards(seed, n_groups, group_size, binary):
    gen = torch.Generator().manual_seed(seed)
    if binary:
        return torch.randint(0, 2, (n_groups * group_size,), generator=gen).to(torch.float64)
    return torch.randn(n_groups * group_size, generator=gen, dtype=torch.float64)


def _mask(seed, batch, tokens):
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.rand(batch, tokens, generator=gen) < 0.7


# --- references from the papers' formulas, written as loops -------------------------------------


def reference_grpo(rewards, group_size, normalize_std=True, eps=1e-6):
    out = []
    for g in range(0, len(rewards), group_size):
        group = [float(r) for r in rewards[g : g + group_size]]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        out += [(r - mean) / (std + eps) if normalize_std else r - mean for r in group]
    return torch.tensor(out, dtype=torch.float64)


def reference_rloo(rewards, group_size):
    out = []
    for g in range(0, len(rewards), group_size):
        group = [float(r) for r in rewards[g : g + group_size]]
        for i, r in enumerate(group):
            others = group[:i] + group[i + 1 :]
            out.append(r - sum(others) / len(others))
    return torch.tensor(out, dtype=torch.float64)


def reference_whiten(values, mask, eps):
    flat = [float(v) for v, m in zip(values.flatten(), mask.flatten(), strict=True) if m]
    mean = sum(flat) / len(flat)
    var = sum((v - mean) ** 2 for v in flat) / max(len(flat) - 1, 1)
    return torch.where(mask, (values - mean) / math.sqrt(var + eps), torch.zeros_like(values))


def reference_returns(token_rewards, mask, gamma):
    returns = torch.zeros_like(token_rewards)
    for i in range(token_rewards.shape[0]):
        valid = [t for t in range(token_rewards.shape[1]) if mask[i, t]]
        for k, t in enumerate(valid):  # G_t = Σ_{j >= k} γ^{j-k} r_{valid[j]}
            later = valid[k:]
            returns[i, t] = sum(gamma**j * float(token_rewards[i, s]) for j, s in enumerate(later))
    return returns


def reference_gae(rewards, values, mask, gamma, lam):
    adv = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        valid = [t for t in range(rewards.shape[1]) if mask[i, t]]
        v = [float(values[i, t]) for t in valid] + [0.0]
        deltas = [float(rewards[i, t]) + gamma * v[k + 1] - v[k] for k, t in enumerate(valid)]
        for k, t in enumerate(valid):  # A_t = Σ_l (γλ)^l δ_{t+l}
            adv[i, t] = sum((gamma * lam) ** j * d for j, d in enumerate(deltas[k:]))
    returns = torch.where(mask, adv + values, torch.zeros_like(adv))
    return adv, returns


# --- hand-computed cases -------------------------------------------------------------------------


def test_grpo_hand_case():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    a = 0.5 / math.sqrt(0.5)  # group [1, 0]: mean 0.5, unbiased std sqrt(0.5)
    assert torch.allclose(grpo_advantages(rewards, 2), torch.tensor([a, -a, 0.0, 0.0]), atol=1e-5)
    dr = grpo_advantages(rewards, 2, normalize_std=False)
    assert torch.allclose(dr, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert torch.all(grpo_advantages(rewards, 1) == 0)


def test_rloo_hand_case():
    assert torch.allclose(rloo_advantages(torch.tensor([1.0, 2.0, 3.0]), 3),
                          torch.tensor([-1.5, 0.0, 1.5]))  # fmt: skip


def test_group_errors():
    with pytest.raises(ValueError, match="groups"):
        grpo_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="group_size"):
        reinforce_pp_advantages(torch.zeros(2), torch.ones(2, 2), baseline="group")
    with pytest.raises(ValueError, match="baseline"):
        reinforce_pp_advantages(torch.zeros(2), torch.ones(2, 2), baseline="mean")


def test_place_and_broadcast():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    placed = place_at_last_token(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert torch.equal(placed, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]))
    spread = broadcast_to_tokens(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert torch.equal(spread, torch.tensor([[2.0, 2.0, 0.0], [0.0, 3.0, 3.0], [0.0, 0.0, 0.0]]))


def test_discounted_returns_skip_masked_positions():
    rewards = torch.tensor([[0.0, 5.0, 1.0]])  # the 5 sits on a masked (tool output) token
    returns = discounted_returns(rewards, torch.tensor([[1, 0, 1]]), gamma=0.5)
    assert torch.allclose(returns, torch.tensor([[0.5, 0.0, 1.0]]))
    returns = discounted_returns(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), gamma=0.5)
    assert torch.allclose(returns, torch.tensor([[0.25, 0.5, 1.0]]))


def test_reinforce_pp_hand_case():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask)
    # returns [[1, 1, -], [0, 0, 0]]: mean 0.4, unbiased var (2·0.36 + 3·0.16)/4 = 0.3
    hi, lo = 0.6 / math.sqrt(0.3 + 1e-8), -0.4 / math.sqrt(0.3 + 1e-8)
    assert torch.allclose(adv, torch.tensor([[hi, hi, 0.0], [lo, lo, lo]]))


def test_reinforce_pp_baseline_hand_case():
    mask = torch.ones(4, 2)
    rewards = torch.tensor([1.0, 0.0, 3.0, 3.0])  # groups of 2: baselines 0.5 and 3
    adv = reinforce_pp_advantages(rewards, mask, baseline="group", group_size=2)
    centred = torch.tensor([[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0], [0.0, 0.0]])
    assert torch.allclose(adv, reference_whiten(centred, mask.bool(), 1e-8).float())


def test_gae_hand_case():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.5, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5, whiten=False)
    # δ = [0.9·0.5-0.5, 0.9·0.5-0.5, 1-0.5] = [-0.05, -0.05, 0.5]; γλ = 0.45
    a2 = 0.5
    a1 = -0.05 + 0.45 * a2
    a0 = -0.05 + 0.45 * a1
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.5, a2 + 0.5, 0.0]]))


# --- properties and reference agreement ----------------------------------------------------------


@FAST
@given(seed=SEEDS, n_groups=st.integers(1, 5), group_size=st.integers(2, 6), binary=st.booleans())
def test_grpo_zero_mean_per_group_and_reference(seed, n_groups, group_size, binary):
    rewards = _rewards(seed, n_groups, group_size, binary)
    for normalize_std in (True, False):
        adv = grpo_advantages(rewards, group_size, normalize_std=normalize_std)
        assert torch.allclose(adv.reshape(n_groups, group_size).mean(-1),
                              torch.zeros(n_groups, dtype=torch.float64), atol=1e-9)  # fmt: skip
        assert torch.allclose(adv, reference_grpo(rewards, group_size, normalize_std))


@FAST
@given(seed=SEEDS, n_groups=st.integers(1, 5), group_size=st.integers(2, 6), binary=st.booleans())
def test_rloo_reference_and_scaling(seed, n_groups, group_size, binary):
    rewards = _rewards(seed, n_groups, group_size, binary)
    adv = rloo_advantages(rewards, group_size)
    assert torch.allclose(adv, reference_rloo(rewards, group_size))
    dr = grpo_advantages(rewards, group_size, normalize_std=False)
    assert torch.allclose(adv, dr * group_size / (group_size - 1))


@FAST
@given(
    seed=SEEDS,
    n_groups=st.integers(1, 3),
    group_size=st.integers(2, 3),
    tokens=st.integers(1, 6),
    gamma=st.sampled_from([1.0, 0.9, 0.5]),
    token_level=st.booleans(),
    baseline=st.sampled_from(["none", "group"]),
)
def test_reinforce_pp_reference(seed, n_groups, group_size, tokens, gamma, token_level, baseline):
    batch = n_groups * group_size
    mask = _mask(seed, batch, tokens)
    gen = torch.Generator().manual_seed(seed)
    if token_level:
        rewards = torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    else:
        rewards = _rewards(seed, n_groups, group_size, binary=False)
    adv = reinforce_pp_advantages(rewards, mask, gamma=gamma, baseline=baseline,
                                  group_size=group_size)  # fmt: skip

    token_rewards = torch.zeros(batch, tokens, dtype=torch.float64)
    for i in range(batch):
        valid = [t for t in range(tokens) if mask[i, t]]
        if not valid:
            continue
        if token_level:
            for t in valid:
                token_rewards[i, t] = rewards[i, t]
        else:
            token_rewards[i, valid[-1]] = rewards[i]
    if baseline == "group":
        totals = token_rewards.sum(-1)
        for i in range(batch):
            g = i // group_size
            base = totals[g * group_size : (g + 1) * group_size].mean()
            valid = [t for t in range(tokens) if mask[i, t]]
            if valid:
                token_rewards[i, valid[-1]] -= base
    if not mask.any():
        assert torch.all(adv == 0)
        return
    expected = reference_whiten(reference_returns(token_rewards, mask, gamma), mask, 1e-8)
    assert torch.allclose(adv, expected, atol=1e-9)


@FAST
@given(
    seed=SEEDS,
    batch=st.integers(1, 4),
    tokens=st.integers(1, 7),
    gamma=st.sampled_from([1.0, 0.99, 0.7]),
    lam=st.sampled_from([1.0, 0.95, 0.5, 0.0]),
)
def test_gae_reference(seed, batch, tokens, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    mask = _mask(seed, batch, tokens)
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam, whiten=False)
    ref_adv, ref_ret = reference_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, ref_adv) and torch.allclose(ret, ref_ret)
    if mask.any():
        white, ret2 = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
        assert torch.allclose(white, reference_whiten(ref_adv, mask, 1e-8), atol=1e-9)
        assert torch.allclose(ret2, ref_ret)
