"""Advantage estimators by name: one decorated function each, looked up in one place.

``algorithm.adv_estimator`` names a registered estimator (``grpo``, ``rloo``, ``reinforce_pp``,
``reinforce_pp_baseline``, ``gae``) or a ``"module.sub:function"`` path to one registered in the
user's own module. A new estimator is one function::

    @advantage_estimator("my_baseline", groups=True)
    def my_baseline(x: AdvantageInputs) -> Estimate:
        mean = x.scores.reshape(-1, x.algo.group_size).mean(-1, keepdim=True)
        per_episode = (x.scores.reshape(-1, x.algo.group_size) - mean).flatten()
        return Estimate(per_episode[x.episode][:, None] * x.loss_mask)

The runtime (``core/runtime/advantages.py`` ``with_advantages``) builds :class:`AdvantageInputs`
for a batch (shaped rewards, each episode's score, KL in the reward) and calls the estimator;
config validation asks the registry whether the name exists and what it needs (groups of
``group_size ≥ 2``, a critic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from core.algorithms.advantages import (
    gae_advantages,
    grpo_advantages,
    place_at_last_token,
    reinforce_pp_advantages,
    rloo_advantages,
)
from core.plugins import Registry

if TYPE_CHECKING:
    from core.algorithms.config import AlgorithmConfig


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator sees of one training batch of ``N`` rows, ``T`` tokens wide."""

    rewards: Tensor  # [N] each row's shaped reward (reward + overlong penalty, then shaped)
    scores: Tensor  # [E] each episode's score: its shaped reward and penalties, minus β·Σ KL
    episode: Tensor  # [N] int64, each row's episode (0..E-1; a group is group_size episodes)
    loss_mask: Tensor  # [N, T] 1 on generated tokens
    token_rewards: Tensor | None  # [N, T] with KL in the reward: reward at the end − β·KL_t
    values: Tensor | None  # [N, T] critic values (use_critic), else None
    algo: AlgorithmConfig


@dataclass(frozen=True)
class Estimate:
    """An estimator's output: ``advantages`` ``[N, T]`` and extra batch fields (a critic's
    ``returns`` and ``old_values``)."""

    advantages: Tensor
    fields: dict[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Estimator:
    """A registered estimator and what it needs from the config."""

    name: str
    fn: Callable[[AdvantageInputs], Estimate]
    groups: bool  # compares the episodes of a group: needs group_size >= 2
    critic: bool  # needs critic values: needs use_critic=true (and only it uses them)


REGISTRY: Registry[Estimator] = Registry(
    kind="advantage estimator", field="adv_estimator", decorator="@advantage_estimator",
    attr="estimator",
)  # fmt: skip
ESTIMATORS = REGISTRY.entries


def advantage_estimator(
    name: str, *, groups: bool = False, critic: bool = False
) -> Callable[[Callable[[AdvantageInputs], Estimate]], Callable[[AdvantageInputs], Estimate]]:
    """Register ``fn`` as the estimator ``name`` (a second function under a taken name fails)."""

    def register(fn: Callable[[AdvantageInputs], Estimate]) -> Callable[..., Estimate]:
        REGISTRY.add(Estimator(name, fn, groups=groups, critic=critic))
        return fn

    return register


def resolve_estimator(name: str) -> Estimator:
    """The estimator ``name`` names: a registered name or a ``module:function`` path to a
    function decorated with :func:`advantage_estimator`. ValueError naming it otherwise."""
    return REGISTRY.resolve(name)


@advantage_estimator("grpo", groups=True)
def grpo(x: AdvantageInputs) -> Estimate:
    """GRPO (arXiv 2402.03300): each episode's score against its group's mean (÷ std unless
    ``normalize_std=false``, Dr. GRPO arXiv 2503.20783), given to every token of its rows."""
    per_episode = grpo_advantages(x.scores, x.algo.group_size, normalize_std=x.algo.normalize_std)
    return Estimate(per_episode[x.episode][:, None] * x.loss_mask)


@advantage_estimator("rloo", groups=True)
def rloo(x: AdvantageInputs) -> Estimate:
    """RLOO (arXiv 2402.14740): each episode's score against the mean of the others'."""
    per_episode = rloo_advantages(x.scores, x.algo.group_size)
    return Estimate(per_episode[x.episode][:, None] * x.loss_mask)


@advantage_estimator("reinforce_pp")
def reinforce_pp(x: AdvantageInputs) -> Estimate:
    """REINFORCE++ (arXiv 2501.03262): discounted returns of each row's token rewards (the
    outcome at its last token), whitened over the batch."""
    source = x.token_rewards if x.token_rewards is not None else x.rewards
    return Estimate(reinforce_pp_advantages(source, x.loss_mask, gamma=x.algo.gamma))


@advantage_estimator("reinforce_pp_baseline", groups=True)
def reinforce_pp_baseline(x: AdvantageInputs) -> Estimate:
    """REINFORCE++-baseline: each row's reward minus its group's mean episode score (with one
    row per episode, the mean of the group's Σ_t r_t), then REINFORCE++."""
    group_mean = x.scores.reshape(-1, x.algo.group_size).mean(dim=-1)
    baseline = group_mean.repeat_interleave(x.algo.group_size)[x.episode]
    if x.token_rewards is None:
        source = x.rewards - baseline
    else:
        source = x.token_rewards - place_at_last_token(baseline, x.loss_mask)
    return Estimate(reinforce_pp_advantages(source, x.loss_mask, gamma=x.algo.gamma))


@advantage_estimator("gae", critic=True)
def gae(x: AdvantageInputs) -> Estimate:
    """GAE (arXiv 1506.02438) over the critic's values: the PPO-with-critic recipe."""
    if x.values is None:
        raise ValueError("adv_estimator='gae' needs critic values (algorithm.use_critic=true)")
    rewards = x.token_rewards
    if rewards is None:
        rewards = place_at_last_token(x.rewards, x.loss_mask)
    advantages, returns = gae_advantages(
        rewards, x.values, x.loss_mask, gamma=x.algo.gamma, lam=x.algo.lam
    )
    return Estimate(advantages, {"returns": returns, "old_values": x.values})
