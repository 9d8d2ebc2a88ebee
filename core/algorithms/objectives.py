"""Policy losses by name: one decorated function each, looked up in one place.

``algorithm.policy_loss`` names a registered loss (``ppo``: the clipped, decoupled PPO
objective with its dual-clip and GSPO options; ``cispo``: MiniMax-M1's clipped importance
weights) or a ``"module.sub:function"`` path to one registered in the user's own module. A new
objective is one function::

    @policy_objective("pg")
    def vanilla_pg(x: PolicyInputs) -> tuple[Tensor, dict[str, Tensor]]:
        token_loss = -x.advantages * x.logprobs
        return aggregate_loss(token_loss, x.loss_mask, x.algo.loss_aggregation,
                              normalizer=x.normalizer, norm_constant=x.algo.loss_norm_constant), {}

The learner's ``PolicyLoss`` (``core/training/losses.py``) builds :class:`PolicyInputs` for each
micro-batch (π_prox recomputed, approximated or taken from the training pass) and adds the KL
and entropy terms; config validation asks the registry whether the name exists and whether the
rest of the algorithm section fits it. Every call of one objective must return the same stats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from core.algorithms.policy_loss import cispo_policy_loss, ppo_policy_loss
from core.plugins import Registry

if TYPE_CHECKING:
    from core.algorithms.config import AlgorithmConfig

LossAndStats = tuple[Tensor, dict[str, Tensor]]


@dataclass(frozen=True)
class PolicyInputs:
    """What a policy loss sees of one micro-batch of ``N`` rows, ``T`` tokens wide."""

    logprobs: Tensor  # [N, T] log π_θ of the sampled tokens: the only input with a gradient
    proximal_logprobs: Tensor  # [N, T] log π_prox (π_old of plain PPO), detached
    advantages: Tensor  # [N, T]
    loss_mask: Tensor  # [N, T] 1 on generated tokens
    behaviour_logprobs: Tensor | None  # [N, T] log π_behav (decoupled), else None
    normalizer: float  # the global denominator of the step (see core.algorithms.aggregation)
    algo: AlgorithmConfig


@dataclass(frozen=True)
class PolicyObjective:
    """A registered policy loss and the config it cannot work with."""

    name: str
    fn: Callable[[PolicyInputs], LossAndStats]
    # the problems of an algorithm section with this loss (settings it ignores), one per line
    problems: Callable[[AlgorithmConfig], list[str]] | None = None


REGISTRY: Registry[PolicyObjective] = Registry(
    kind="policy loss", field="policy_loss", decorator="@policy_objective", attr="objective"
)
OBJECTIVES = REGISTRY.entries


def policy_objective(
    name: str, *, problems: Callable[[AlgorithmConfig], list[str]] | None = None
) -> Callable[[Callable[[PolicyInputs], LossAndStats]], Callable[[PolicyInputs], LossAndStats]]:
    """Register ``fn`` as the policy loss ``name`` (a second function under a taken name fails).
    ``problems(algo)`` lists what in the algorithm section the loss cannot honour."""

    def register(fn: Callable[[PolicyInputs], LossAndStats]) -> Callable[..., LossAndStats]:
        REGISTRY.add(PolicyObjective(name, fn, problems))
        return fn

    return register


def resolve_objective(name: str) -> PolicyObjective:
    """The policy loss ``name`` names: a registered name or a ``module:function`` path to a
    function decorated with :func:`policy_objective`. ValueError naming it otherwise."""
    return REGISTRY.resolve(name)


def _shared(x: PolicyInputs) -> dict[str, Any]:
    """The keyword arguments both built-in losses take from a micro-batch and its config: the
    behaviour weights' settings, the clip range, the aggregation."""
    a = x.algo
    return dict(
        behaviour_logprobs=x.behaviour_logprobs,
        eps_clip=a.eps_clip,
        eps_clip_high=a.eps_clip_high,
        aggregation=a.loss_aggregation,
        normalizer=x.normalizer,
        norm_constant=a.loss_norm_constant,
        behaviour_cap=a.behaviour_cap,
        behaviour_mask_mode=a.behaviour_mask_mode,
        behaviour_level=a.behaviour_level,
        behaviour_cap_low=a.behaviour_cap_low,
        behaviour_veto=a.behaviour_veto,
    )


@policy_objective("ppo")
def ppo(x: PolicyInputs) -> LossAndStats:
    """Clipped PPO (arXiv 1707.06347) in AReaL's decoupled form (arXiv 2505.24298), with
    clip-higher (DAPO), dual clip and GSPO's sequence-level ratio as options."""
    return ppo_policy_loss(
        x.logprobs,
        x.proximal_logprobs,
        x.advantages,
        x.loss_mask,
        dual_clip=x.algo.dual_clip,
        importance_level=x.algo.importance_level,
        **_shared(x),
    )


def _cispo_problems(algo: AlgorithmConfig) -> list[str]:
    problems = []
    if algo.importance_level != "token":
        problems.append("policy_loss='cispo' weighs each token: importance_level must be 'token'")
    if algo.dual_clip is not None:
        problems.append("policy_loss='cispo' clips no loss: dual_clip must be None")
    return problems


@policy_objective("cispo", problems=_cispo_problems)
def cispo(x: PolicyInputs) -> LossAndStats:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update."""
    return cispo_policy_loss(
        x.logprobs, x.proximal_logprobs, x.advantages, x.loss_mask, **_shared(x)
    )
