"""(Decoupled) PPO policy loss, dual clip, GSPO, behaviour weights, log-linear proximal."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import (
    AGGREGATION_MODES,
    behaviour_weights,
    global_normalizer,
    loglinear_alpha,
    loglinear_proximal_logprobs,
    ppo_policy_loss,
)

pytestmark = pytest.mark.unit

SEEDS = st.integers(0, 2**31 - 1)
FAST = settings(max_examples=50, deadline=None)


def _case(seed, batch, tokens, *, spread=0.5, behaviour=True):
    """Random float64 log-probs near each other, advantages, a mask with some empty rows."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    prox = -rnd(batch, tokens).abs() - 0.1
    logprobs = prox + spread * rnd(batch, tokens)
    behav = prox + spread * rnd(batch, tokens) if behaviour else None
    adv = rnd(batch, tokens)
    mask = torch.rand(batch, tokens, generator=gen) < 0.75
    return logprobs, prox, adv, mask, behav


def _loss(logprobs, *args, **kwargs):
    """Loss and gradient wrt ``logprobs``."""
    leaf = logprobs.clone().requires_grad_(True)
    loss, stats = ppo_policy_loss(leaf, *args, **kwargs)
    loss.backward()
    return loss.detach(), leaf.grad, stats


# --- reference written from the published formulas, one token at a time -----------------------


def reference_loss(
    logprobs, prox, adv, mask, behav=None, *, eps_low=0.2, eps_high=None, dual_clip=None,
    importance_level="token", cap=None, cap_mode="cap", behaviour_level="token",
    cap_low=None, veto=None, aggregation="token-mean", norm_constant=None,
):  # fmt: skip
    """PPO (1707.06347) / decoupled PPO (2505.24298 eq. 5) / dual clip (1912.09729) / GSPO-token
    (2507.18071 eq. 12) written as loops; aggregation as verl's agg_loss with empty rows skipped."""
    eps_high = eps_low if eps_high is None else eps_high
    batch, tokens = logprobs.shape
    seq_sums, seq_means, n_tokens = [], [], 0
    for i in range(batch):
        valid = [t for t in range(tokens) if mask[i, t]]
        if not valid:
            continue
        if importance_level == "sequence":
            s_i = math.exp(
                sum(float(logprobs[i, t].detach() - prox[i, t]) for t in valid) / len(valid)
            )
        if behav is not None:
            log_ws = [float(prox[i, t] - behav[i, t]) for t in valid]
            w_seq = {
                "sequence": math.exp(sum(log_ws)),
                "geometric": math.exp(sum(log_ws) / len(valid)),
            }.get(behaviour_level)
            vetoed = veto is not None and min(math.exp(x) for x in log_ws) < veto
        losses = []
        for t in valid:
            if importance_level == "token":
                r = torch.exp(logprobs[i, t] - prox[i, t])
            else:  # s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]
                r = s_i * torch.exp(logprobs[i, t] - logprobs[i, t].detach())
            a = float(adv[i, t])
            surrogate = torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
            loss = -surrogate
            if dual_clip is not None and a < 0:
                loss = torch.minimum(loss, torch.tensor(dual_clip * -a, dtype=loss.dtype))
            if behav is not None:
                w = math.exp(float(prox[i, t] - behav[i, t]))
                if w_seq is not None:
                    w = w_seq
                if cap is not None and w > cap:
                    w = cap if cap_mode == "cap" else 0.0
                if cap_low is not None and w < cap_low:
                    w = 0.0
                if vetoed:
                    w = 0.0
                loss = loss * w
            losses.append(loss)
        n_tokens += len(losses)
        seq_sums.append(sum(losses))
        seq_means.append(sum(losses) / len(losses))
    if not seq_sums:
        return logprobs.sum() * 0.0
    if aggregation == "token-mean":
        return sum(seq_sums) / n_tokens
    if aggregation == "seq-mean-token-sum":
        return sum(seq_sums) / len(seq_sums)
    if aggregation == "seq-mean-token-mean":
        return sum(seq_means) / len(seq_means)
    c = tokens if norm_constant is None else norm_constant
    return sum(seq_sums) / (len(seq_sums) * c)


# --- hand-computed cases -------------------------------------------------------------------------


def test_ratio_one_is_minus_mean_advantage_and_policy_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]])
    adv = torch.tensor([[1.0, -3.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, grad, stats = _loss(logprobs, logprobs, adv, mask)
    assert loss.item() == pytest.approx(-(1.0 - 3.0) / 2)
    assert torch.allclose(grad, torch.tensor([[-0.5, 1.5, 0.0]]))  # -A/N on valid tokens
    assert stats["clip_frac"].item() == 0.0
    assert stats["approx_kl"].item() == 0.0
    assert stats["ratio_mean"].item() == 1.0


@pytest.mark.parametrize(
    "ratio,adv,expected_loss,expected_grad,clipped",
    [
        (1.5, 1.0, -1.2, 0.0, True),  # above 1+eps with A>0: clipped, flat
        (1.1, 1.0, -1.1, -1.1, False),  # inside the trust region
        (0.5, 1.0, -0.5, -0.5, False),  # below 1-eps with A>0: unclipped (pessimistic)
        (0.5, -1.0, 0.8, 0.0, True),  # below 1-eps with A<0: clipped, flat
        (1.5, -1.0, 1.5, 1.5, False),  # above 1+eps with A<0: unclipped
    ],
)
def test_single_token_clipping(ratio, adv, expected_loss, expected_grad, clipped):
    prox = torch.tensor([[-1.0]])
    logprobs = prox + math.log(ratio)
    loss, grad, stats = _loss(logprobs, prox, torch.tensor([[adv]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(expected_loss)
    assert grad.item() == pytest.approx(expected_grad)  # d(-A r)/dlogp = -A r
    assert stats["clip_frac"].item() == float(clipped)


def test_clip_higher_is_asymmetric():
    prox = torch.tensor([[-1.0, -1.0]])
    logprobs = prox + math.log(1.25)
    adv = torch.tensor([[1.0, 1.0]])
    loss, _, _ = _loss(logprobs, prox, adv, torch.ones(1, 2), eps_clip=0.2, eps_clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25)  # 1.25 < 1.28: not clipped
    loss, _, _ = _loss(logprobs, prox, adv, torch.ones(1, 2), eps_clip=0.2)
    assert loss.item() == pytest.approx(-1.2)


def test_dual_clip_hand_case():
    prox = torch.tensor([[-1.0, -1.0]])
    logprobs = prox + torch.log(torch.tensor([[5.0, 2.0]]))
    adv = torch.tensor([[-1.0, -1.0]])
    loss, grad, stats = _loss(logprobs, prox, adv, torch.ones(1, 2), dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)  # min(5, 3) and min(2, 3)
    assert grad[0, 0].item() == 0.0 and grad[0, 1].item() == pytest.approx(2.0 / 2)
    assert stats["dual_clip_frac"].item() == 0.5


def test_behaviour_weight_cap_and_mask_hand_case():
    prox = torch.tensor([[-1.0, -1.0]])
    behav = prox - torch.log(torch.tensor([[2.0, 8.0]]))  # weights 2 and 8
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    kw = dict(behaviour_logprobs=behav, behaviour_cap=4.0)
    loss, grad, stats = _loss(prox, prox, adv, mask, behaviour_mask_mode="cap", **kw)
    assert loss.item() == pytest.approx(-(2.0 + 4.0) / 2)
    assert torch.allclose(grad, torch.tensor([[-1.0, -2.0]]))
    assert stats["behav_weight_max"].item() == pytest.approx(8.0)
    assert stats["behav_weight_mean"].item() == pytest.approx(5.0)
    assert stats["behav_masked_frac"].item() == 0.5
    loss, grad, _ = _loss(prox, prox, adv, mask, behaviour_mask_mode="mask", **kw)
    assert loss.item() == pytest.approx(-2.0 / 2)  # dropped token still counts in the denominator
    assert torch.allclose(grad, torch.tensor([[-1.0, 0.0]]))


def test_geometric_level_behaviour_mask_drops_whole_rows():
    prox = torch.zeros(2, 2) - 1.0
    behav = prox - torch.log(torch.tensor([[1.0, 16.0], [2.0, 2.0]]))  # geo-means 4 and 2
    loss, grad, stats = _loss(
        prox, prox, torch.ones(2, 2), torch.ones(2, 2), behaviour_logprobs=behav,
        behaviour_cap=3.0, behaviour_mask_mode="mask", behaviour_level="geometric",
    )  # fmt: skip
    assert loss.item() == pytest.approx(-(2.0 + 2.0) / 4)
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0], [-0.5, -0.5]]))
    assert stats["behav_masked_frac"].item() == 0.5


def test_rollout_corrections_hand_case():
    """Truncated/masked IS at token, sequence (product) and geometric level, the lower bound,
    the veto, and their statistics (issue 32: rollout corrections)."""
    prox = torch.zeros(2, 2) - 1.0
    behav = prox - torch.log(torch.tensor([[2.0, 2.0], [0.25, 1.0]]))  # token weights
    ones = torch.ones(2, 2)

    def weights(**kw):
        w, raw, excluded = behaviour_weights(prox, behav, ones, **kw)
        return w.flatten().tolist(), raw.flatten().tolist(), excluded.flatten().tolist()

    w, raw, _ = weights(level="sequence", cap=3.0)  # products 4 and 1/4
    assert raw == pytest.approx([4.0, 4.0, 0.25, 0.25]) and w[:2] == [3.0, 3.0]
    w, raw, _ = weights(level="geometric")  # geometric means 2 and 1/2
    assert raw == pytest.approx([2.0, 2.0, 0.5, 0.5])
    w, _, excluded = weights(level="token", mask_mode="mask", cap=3.0, cap_low=0.5)
    assert w == pytest.approx([2.0, 2.0, 0.0, 1.0]) and excluded == [False, False, True, False]
    w, _, excluded = weights(level="token", veto=0.5)  # row 2 has a token at 1/4
    assert w == pytest.approx([2.0, 2.0, 0.0, 0.0]) and excluded == [False, False, True, True]
    with pytest.raises(ValueError, match="cap_low"):
        weights(cap_low=0.5)  # cap mode has no lower bound
    _, _, stats = _loss(prox, prox, ones, ones, behaviour_logprobs=behav)
    assert stats["behav_weight_min"].item() == pytest.approx(0.25)
    # ESS of weights 2, 2, 1/4, 1: (5.25)² / (4 · 9.0625)
    assert stats["behav_ess"].item() == pytest.approx(5.25**2 / (4 * 9.0625))


def test_a_huge_sequence_weight_stays_finite():
    prox = torch.zeros(1, 40)
    behav = prox - 2.0  # product e^80: clamped to e^20
    w, raw, _ = behaviour_weights(prox, behav, torch.ones(1, 40), level="sequence", cap=5.0)
    assert torch.isfinite(raw).all() and raw.max().item() == pytest.approx(math.exp(20))
    assert w.max().item() == 5.0


def test_gspo_sequence_ratio_is_geometric_mean():
    prox = torch.tensor([[-1.0, -1.0, -1.0]])
    logprobs = prox + torch.tensor([[0.1, -0.3, 99.0]])  # last token is padding
    mask = torch.tensor([[1, 1, 0]])
    _, _, stats = _loss(logprobs, prox, torch.ones(1, 3), mask, importance_level="sequence")
    assert stats["ratio_mean"].item() == pytest.approx(math.exp(-0.1))
    assert stats["ratio_max"].item() == pytest.approx(math.exp(-0.1))


def test_padding_with_inf_and_nan_is_ignored():
    logprobs = torch.tensor([[-1.0, float("-inf")]])
    adv = torch.tensor([[2.0, float("nan")]])
    loss, grad, stats = _loss(logprobs, logprobs, adv, torch.tensor([[1, 0]]))
    assert loss.item() == pytest.approx(-2.0)
    assert torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in stats.values())


def test_argument_errors():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(x, x, x, x, dual_clip=1.0)
    with pytest.raises(ValueError, match="importance_level"):
        ppo_policy_loss(x, x, x, x, importance_level="seq")
    with pytest.raises(ValueError, match="behaviour_mask_mode"):
        ppo_policy_loss(x, x, x, x, behaviour_logprobs=x, behaviour_mask_mode="drop")
    with pytest.raises(ValueError, match="eps_clip"):
        ppo_policy_loss(x, x, x, x, eps_clip=-0.1)


# --- properties ----------------------------------------------------------------------------------


@FAST
@given(seed=SEEDS, batch=st.integers(1, 5), tokens=st.integers(1, 6))
def test_ratio_one_gives_minus_mean_advantage(seed, batch, tokens):
    _, prox, adv, mask, _ = _case(seed, batch, tokens)
    loss, _, _ = _loss(prox, prox, adv, mask, aggregation="token-mean")
    expected = adv[mask].mean().item() if mask.any() else 0.0
    assert loss.item() == pytest.approx(-expected, abs=1e-12)


@FAST
@given(seed=SEEDS, batch=st.integers(1, 5), tokens=st.integers(1, 6), eps=st.floats(0.05, 0.3))
def test_clip_region_has_zero_gradient(seed, batch, tokens, eps):
    logprobs, prox, adv, mask, _ = _case(seed, batch, tokens, spread=0.6)
    _, grad, _ = _loss(logprobs, prox, adv, mask, eps_clip=eps)
    ratio = torch.exp(logprobs - prox)
    in_clip = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    assert torch.all(grad[in_clip | ~mask] == 0)
    n = max(int(mask.sum()), 1)
    active = mask & ~in_clip
    assert torch.allclose(grad[active], (-adv * ratio / n)[active])


@FAST
@given(seed=SEEDS, batch=st.integers(1, 4), tokens=st.integers(1, 5), c=st.floats(1.05, 5.0))
def test_dual_clip_bounds_negative_advantage_loss(seed, batch, tokens, c):
    logprobs, prox, adv, _, _ = _case(seed, batch, tokens, spread=2.0)
    for i in range(batch):
        for t in range(tokens):
            one = (logprobs[i : i + 1, t : t + 1], prox[i : i + 1, t : t + 1])
            a = adv[i : i + 1, t : t + 1]
            loss, _, _ = _loss(*one, a, torch.ones(1, 1), dual_clip=c)
            plain, _, _ = _loss(*one, a, torch.ones(1, 1))
            if a.item() < 0:
                assert loss.item() <= c * abs(a.item()) + 1e-12
                assert loss.item() == pytest.approx(min(plain.item(), c * abs(a.item())))
            else:
                assert loss.item() == plain.item()


@FAST
@given(
    seed=SEEDS,
    batch=st.integers(1, 5),
    tokens=st.integers(1, 6),
    importance_level=st.sampled_from(["token", "sequence"]),
    dual_clip=st.sampled_from([None, 2.0]),
    aggregation=st.sampled_from(AGGREGATION_MODES),
)
def test_decoupled_equals_plain_ppo_when_behaviour_is_proximal(
    seed, batch, tokens, importance_level, dual_clip, aggregation
):
    logprobs, prox, adv, mask, _ = _case(seed, batch, tokens)
    kw = dict(importance_level=importance_level, dual_clip=dual_clip, aggregation=aggregation)
    plain, plain_grad, _ = _loss(logprobs, prox, adv, mask, **kw)
    for level in ("token", "sequence", "geometric"):
        for mode in ("cap", "mask"):
            loss, grad, stats = _loss(
                logprobs, prox, adv, mask, behaviour_logprobs=prox.clone(), behaviour_cap=1.5,
                behaviour_mask_mode=mode, behaviour_level=level, **kw,
            )  # fmt: skip
            assert torch.allclose(loss, plain) and torch.allclose(grad, plain_grad)
            assert stats["behav_masked_frac"].item() == 0.0


@FAST
@given(
    seed=SEEDS,
    batch=st.integers(1, 4),
    tokens=st.integers(1, 5),
    eps_high=st.sampled_from([None, 0.28]),
    dual_clip=st.sampled_from([None, 3.0]),
    importance_level=st.sampled_from(["token", "sequence"]),
    decoupled=st.booleans(),
    cap=st.sampled_from([None, 1.3]),
    cap_mode=st.sampled_from(["cap", "mask"]),
    behaviour_level=st.sampled_from(["token", "sequence", "geometric"]),
    cap_low=st.sampled_from([None, 0.8]),
    veto=st.sampled_from([None, 0.5]),
    aggregation=st.sampled_from(AGGREGATION_MODES),
)
def test_matches_reference(
    seed, batch, tokens, eps_high, dual_clip, importance_level, decoupled, cap, cap_mode,
    behaviour_level, cap_low, veto, aggregation,
):  # fmt: skip
    logprobs, prox, adv, mask, behav = _case(seed, batch, tokens, behaviour=decoupled)
    kw = dict(eps_clip_high=eps_high, dual_clip=dual_clip, importance_level=importance_level,
              aggregation=aggregation)  # fmt: skip
    cap_low = cap_low if cap_mode == "mask" else None
    bkw = dict(behaviour_cap=cap, behaviour_mask_mode=cap_mode, behaviour_level=behaviour_level,
               behaviour_cap_low=cap_low, behaviour_veto=veto)  # fmt: skip
    loss, grad, _ = _loss(logprobs, prox, adv, mask, behaviour_logprobs=behav, **kw, **bkw)

    leaf = logprobs.clone().requires_grad_(True)
    expected = reference_loss(
        leaf, prox, adv, mask, behav, eps_high=eps_high, dual_clip=dual_clip,
        importance_level=importance_level, cap=cap, cap_mode=cap_mode,
        behaviour_level=behaviour_level, cap_low=cap_low, veto=veto, aggregation=aggregation,
    )  # fmt: skip
    expected.backward()
    expected_grad = torch.zeros_like(logprobs) if leaf.grad is None else leaf.grad
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert torch.allclose(grad, expected_grad)


@FAST
@given(seed=SEEDS, batch=st.integers(1, 5), tokens=st.integers(1, 6), eps=st.floats(0.01, 0.3))
def test_gspo_matches_the_sequence_objective(seed, batch, tokens, eps):
    """With sequence-constant advantages and seq-mean-token-mean, the GSPO-token loss equals
    GSPO's sequence objective -1/G Σ_i min(s_i A_i, clip(s_i) A_i), value and gradient."""
    logprobs, prox, adv, mask, _ = _case(seed, batch, tokens, spread=0.2)
    seq_adv = adv[:, :1].expand_as(adv)
    loss, grad, _ = _loss(
        logprobs, prox, seq_adv, mask, importance_level="sequence", eps_clip=eps,
        aggregation="seq-mean-token-mean",
    )  # fmt: skip
    leaf = logprobs.clone().requires_grad_(True)
    terms = []
    for i in range(batch):
        valid = mask[i]
        if valid.any():
            s = torch.exp((leaf[i][valid] - prox[i][valid]).mean())
            a = seq_adv[i, 0]
            terms.append(-torch.minimum(s * a, s.clamp(1 - eps, 1 + eps) * a))
    expected = sum(terms) / len(terms) if terms else leaf.sum() * 0
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert torch.allclose(grad, leaf.grad)


@FAST
@given(
    seed=SEEDS,
    batch=st.integers(1, 8),
    tokens=st.integers(1, 6),
    aggregation=st.sampled_from(AGGREGATION_MODES),
    importance_level=st.sampled_from(["token", "sequence"]),
    behaviour_level=st.sampled_from(["token", "sequence"]),
    data=st.data(),
)
def test_micro_batch_split_invariance(
    seed, batch, tokens, aggregation, importance_level, behaviour_level, data
):
    """Split rows into micro-batches, use the global normaliser, sum: same loss and gradient."""
    logprobs, prox, adv, mask, behav = _case(seed, batch, tokens)
    kw = dict(
        behaviour_logprobs=behav, behaviour_cap=1.5, behaviour_mask_mode="mask",
        behaviour_level=behaviour_level, importance_level=importance_level, dual_clip=3.0,
        eps_clip_high=0.28, aggregation=aggregation,
    )  # fmt: skip
    full, full_grad, _ = _loss(logprobs, prox, adv, mask, **kw)

    cuts = sorted(data.draw(st.sets(st.integers(1, batch - 1), max_size=3)) if batch > 1 else [])
    bounds = [0, *cuts, batch]
    chunks = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    norm = global_normalizer([mask[c] for c in chunks], aggregation)
    assert norm == global_normalizer(mask, aggregation)

    leaf = logprobs.clone().requires_grad_(True)
    total = 0.0
    for c in chunks:
        kw["behaviour_logprobs"] = behav[c]
        loss, _ = ppo_policy_loss(leaf[c], prox[c], adv[c], mask[c], normalizer=norm, **kw)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(leaf.grad, full_grad)


# --- log-linear proximal approximation ------------------------------------------------------------


def test_loglinear_alpha_hand_cases():
    versions = torch.tensor([[-1, 7, 8, 9, 10, 11, 5]])
    alpha = loglinear_alpha(versions, current_version=10)  # v_prox = 9
    # prompt 0; (9-7)/(10-7)=2/3; (9-8)/2=1/2; from v_prox itself 0; v_θ and newer: not
    # generated by any weights before the update, 0; (9-5)/(10-5)=4/5.
    expected = torch.tensor([[0.0, 2 / 3, 1 / 2, 0.0, 0.0, 0.0, 4 / 5]])
    assert torch.allclose(alpha, expected)
    alpha = loglinear_alpha(torch.tensor([[6, 8]]), current_version=9, proximal_version=8)
    assert torch.allclose(alpha, torch.tensor([[2 / 3, 0.0]]))


def test_loglinear_proximal_keeps_clipping_on_policy_tokens():
    """Issue 32 #1: tokens generated by the proximal weights (v_b = v_prox) must get π_prox =
    π_behav, so a policy that moved (θ = behav + 1, a later minibatch) is clipped. With α = 1
    there π_prox was the detached training log-prob: ratio 1, nothing clipped."""
    behav = torch.full((2, 4), -2.0, dtype=torch.float64)
    logprobs = (behav + 1.0).requires_grad_(True)
    versions = torch.full((2, 4), 3)  # generated at the learner's version at the update's start
    prox = loglinear_proximal_logprobs(behav, logprobs, versions, 4, proximal_version=3)
    assert torch.equal(prox, behav)
    adv = torch.ones(2, 4, dtype=torch.float64)
    mask = torch.ones(2, 4)
    loss, stats = ppo_policy_loss(logprobs, prox, adv, mask, behaviour_logprobs=behav)
    assert stats["clip_frac"].item() == 1.0
    assert stats["ratio_mean"].item() == pytest.approx(math.e)
    loss.backward()
    assert logprobs.grad.abs().max().item() == 0.0  # clipped at 1 + ε: no gradient


@FAST
@given(seed=SEEDS, current=st.integers(1, 20), stale=st.integers(0, 8))
def test_loglinear_proximal_formula(seed, current, stale):
    gen = torch.Generator().manual_seed(seed)
    behav = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
    cur = (-torch.rand(3, 4, generator=gen, dtype=torch.float64)).requires_grad_(True)
    versions = torch.randint(-1, current + 1, (3, 4), generator=gen).clamp(
        min=max(current - stale, -1)
    )
    prox = loglinear_proximal_logprobs(behav, cur, versions, current)
    assert not prox.requires_grad
    for v, b, c, p in zip(versions.flatten(), behav.flatten(), cur.flatten(), prox.flatten(),
                          strict=True):  # fmt: skip
        v = int(v)
        if v < 0 or v >= current:
            alpha = 0.0
        else:
            alpha = min(max((current - 1 - v) / (current - v), 0.0), 1.0)
        assert p.item() == pytest.approx(b.item() + alpha * (c.item() - b.item()), abs=1e-12)
        assert min(b.item(), c.item()) - 1e-12 <= p.item() <= max(b.item(), c.item()) + 1e-12
