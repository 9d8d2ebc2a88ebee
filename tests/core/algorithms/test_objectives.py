"""Policy losses by name: CISPO against its formula and against PPO, a user's loss by import
path inside the learner's loss, and the errors a wrong name or pairing gives before any work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from core.algorithms import algorithm_config, cispo_policy_loss, ppo_policy_loss
from core.algorithms.objectives import OBJECTIVES, resolve_objective
from core.config import ConfigError, load_config
from core.training.losses import PolicyLoss
from tests.core.algorithms.test_estimators import _batch

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]

# The module docstring's example, in a module of the user's own.
USER_MODULE = """
from core.algorithms import aggregate_loss
from core.algorithms.objectives import PolicyInputs, policy_objective


@policy_objective("pg")
def vanilla_pg(x: PolicyInputs):
    token_loss = -x.advantages * x.logprobs
    return aggregate_loss(token_loss, x.loss_mask, x.algo.loss_aggregation,
                          normalizer=x.normalizer, norm_constant=x.algo.loss_norm_constant), {}


def not_a_loss(x):
    return x
"""


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_losses.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_losses"
    sys.modules.pop("my_losses", None)
    OBJECTIVES.pop("pg", None)


def _case(seed: int, batch: int = 4, tokens: int = 6):
    gen = torch.Generator().manual_seed(seed)
    prox = -torch.rand(batch, tokens, generator=gen, dtype=torch.float64) - 0.1
    logprobs = prox + 0.6 * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    behav = prox + 0.3 * torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    adv = torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    mask = torch.rand(batch, tokens, generator=gen) < 0.8
    return logprobs, prox, adv, mask, behav


def _grad(fn, logprobs, *args, **kwargs):
    leaf = logprobs.clone().requires_grad_(True)
    loss, stats = fn(leaf, *args, **kwargs)
    loss.backward()
    return loss.detach(), leaf.grad, stats


@pytest.mark.parametrize("seed", range(5))
def test_cispo_is_its_formula_token_by_token(seed: int) -> None:
    """MiniMax-M1 eq. 4 with the decoupled behaviour weight (truncated at a cap that binds),
    token-mean over the mask: the gradient ``-r̂·w·A/n`` and the value ``-r̂·w·A/n``."""
    logprobs, prox, adv, mask, behav = _case(seed)
    eps_low, eps_high, cap = 0.3, 0.28, 1.1
    loss, grad, stats = _grad(
        cispo_policy_loss, logprobs, prox, adv, mask, behaviour_logprobs=behav,
        eps_clip=eps_low, eps_clip_high=eps_high, behaviour_cap=cap, behaviour_mask_mode="cap",
    )  # fmt: skip
    n = int(mask.sum())
    want_loss, want_grad, truncated, capped = 0.0, torch.zeros_like(logprobs), 0, 0
    for i, t in mask.nonzero().tolist():
        r = float((logprobs[i, t] - prox[i, t]).exp())
        w_raw = float((prox[i, t] - behav[i, t]).exp())
        w = min(w_raw, cap)
        r_hat = min(max(r, 1 - eps_low), 1 + eps_high)
        truncated, capped = truncated + (r_hat != r), capped + (w != w_raw)
        want_loss += -r_hat * w * float(adv[i, t]) / n
        want_grad[i, t] = -r_hat * w * float(adv[i, t]) / n
    assert loss.item() == pytest.approx(want_loss, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(grad, want_grad)
    assert stats["clip_frac"].item() == pytest.approx(truncated / n)
    assert 0 < truncated < n and 0 < capped < n  # both clips bind on some tokens, not all


def test_on_policy_cispo_and_ppo_take_the_same_step() -> None:
    """At π_θ = π_prox the ratio is 1 and neither clips: the two gradients are equal."""
    _, prox, adv, mask, behav = _case(7)
    kwargs = dict(behaviour_logprobs=behav, behaviour_cap=5.0, behaviour_mask_mode="mask")
    _, ppo_grad, _ = _grad(ppo_policy_loss, prox, prox, adv, mask, **kwargs)
    _, cispo_grad, _ = _grad(cispo_policy_loss, prox, prox, adv, mask, **kwargs)
    torch.testing.assert_close(cispo_grad, ppo_grad)
    assert ppo_grad.abs().sum() > 0


def test_cispo_keeps_the_gradient_of_a_token_ppo_clips() -> None:
    """A positive-advantage token already 2× likelier than π_prox: PPO's clip drops its gradient;
    CISPO still pushes it up, with weight 1 + ε_high."""
    prox = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    logprobs = prox + torch.tensor([[0.0, 0.7]], dtype=torch.float64)
    adv, mask = torch.ones_like(prox), torch.ones_like(prox, dtype=torch.bool)
    _, ppo_grad, ppo_stats = _grad(ppo_policy_loss, logprobs, prox, adv, mask, eps_clip=0.2)
    _, cispo_grad, stats = _grad(cispo_policy_loss, logprobs, prox, adv, mask, eps_clip=0.2)
    assert ppo_grad[0, 1] == 0 and ppo_stats["clip_frac"] == 0.5
    assert cispo_grad[0, 1].item() == pytest.approx(-1.2 / 2)  # -(1 + ε) · A / n
    assert cispo_grad[0, 0].item() == pytest.approx(-1.0 / 2) and stats["clip_frac"] == 0.5
    assert set(stats) == set(ppo_stats)  # the learner logs the same columns for either


def test_the_learner_calls_the_named_loss(user_module: str) -> None:
    """PolicyLoss dispatches on algorithm.policy_loss: off policy (π_θ ≠ π_behav, PPO's π_old
    here) each of a user's plain policy gradient (by import path), CISPO and PPO gives what its
    own function gives, and the three differ."""
    batch = _batch()
    gen = torch.Generator().manual_seed(0)
    advantages = torch.randn(batch.loss_mask.shape, generator=gen)
    batch = batch.with_fields(advantages=advantages)
    shift = 0.5 * torch.randn(batch.loss_mask.shape, generator=gen)
    outputs = batch.behaviour_logprobs + shift * batch.loss_mask
    common = dict(group_size=4, decoupled=False, kl_coef=0.0)
    algos = {
        "pg": algorithm_config("grpo", policy_loss=f"{user_module}:vanilla_pg", **common),
        "cispo": algorithm_config("cispo", **common),
        "ppo": algorithm_config("grpo", **common),
    }
    mask, behav = batch.loss_mask, batch.behaviour_logprobs
    n = float(mask.sum())
    direct = {
        "pg": -(advantages * outputs * mask).sum() / n,
        "cispo": cispo_policy_loss(outputs, behav, advantages, mask, eps_clip=1.0,
                                   eps_clip_high=0.28, normalizer=n)[0],
        "ppo": ppo_policy_loss(outputs, behav, advantages, mask, normalizer=n)[0],
    }  # fmt: skip
    losses = {}
    for name, algo in algos.items():
        loss_fn = PolicyLoss(algo)
        loss, stats = loss_fn(batch, outputs.clone(), loss_fn.normalizer([batch]))
        assert loss_fn.normalizer([batch]) == n
        torch.testing.assert_close(loss, direct[name])
        assert stats["policy_loss"] == loss.detach()
        losses[name] = loss.item()
    assert len({round(v, 6) for v in losses.values()}) == 3, losses
    assert resolve_objective(f"{user_module}:vanilla_pg") is OBJECTIVES["pg"]


def test_the_learner_forwards_every_ppo_setting() -> None:
    """Through the registry, PolicyLoss hands PPO every knob of the algorithm section: dual
    clip, GSPO's sequence ratio, clip-higher, the behaviour cap, level, lower bound and veto,
    the aggregation and its constant."""
    batch = _batch()
    gen = torch.Generator().manual_seed(1)
    advantages = torch.randn(batch.loss_mask.shape, generator=gen)
    proximal = batch.behaviour_logprobs + 0.3 * torch.randn(advantages.shape, generator=gen)
    batch = batch.with_fields(advantages=advantages, proximal_logprobs=proximal)
    outputs = proximal + 0.4 * torch.randn(advantages.shape, generator=gen)
    knobs = dict(
        eps_clip=0.1, eps_clip_high=0.3, dual_clip=2.0, importance_level="sequence",
        behaviour_cap=1.5, behaviour_mask_mode="mask", behaviour_level="geometric",
        behaviour_cap_low=0.5, behaviour_veto=0.2, loss_aggregation="seq-mean-token-sum-norm",
        loss_norm_constant=7.0,
    )  # fmt: skip
    algo = algorithm_config("grpo", group_size=4, kl_coef=0.0, **knobs)
    loss_fn = PolicyLoss(algo)
    normalizer = loss_fn.normalizer([batch])
    loss, stats = loss_fn(batch, outputs, normalizer)
    want, want_stats = ppo_policy_loss(
        outputs, proximal, advantages, batch.loss_mask,
        behaviour_logprobs=batch.behaviour_logprobs, eps_clip=0.1, eps_clip_high=0.3,
        dual_clip=2.0, importance_level="sequence", behaviour_cap=1.5, behaviour_mask_mode="mask",
        behaviour_level="geometric", behaviour_cap_low=0.5, behaviour_veto=0.2,
        aggregation="seq-mean-token-sum-norm", normalizer=normalizer, norm_constant=7.0,
    )  # fmt: skip
    torch.testing.assert_close(loss, want)
    assert {k: v.item() for k, v in want_stats.items()} == {k: stats[k].item() for k in want_stats}
    plain, _ = ppo_policy_loss(outputs, proximal, advantages, batch.loss_mask, normalizer=1.0)
    assert abs(plain.item() - loss.item()) > 1e-4  # the knobs change the loss


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.policy_loss=cipso", r"policy_loss='cipso' is not one of \['ppo', 'cispo'"),
        ("algorithm.policy_loss=my_losses:not_a_loss", "is not decorated with @policy_objective"),
        ("algorithm.policy_loss=no_such_module:fn", "cannot import module 'no_such_module'"),
    ],
)
def test_a_wrong_policy_loss_fails_at_load_naming_the_field(
    user_module: str, override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "experiments/quickstart.yaml", [override])


def test_cispo_refuses_the_ppo_options_it_cannot_honour() -> None:
    with pytest.raises(ValueError, match="importance_level must be 'token'"):
        algorithm_config("cispo", importance_level="sequence")
    with pytest.raises(ValueError, match="dual_clip must be None"):
        algorithm_config("cispo", dual_clip=3.0)
    assert algorithm_config("cispo").policy_loss == "cispo"
