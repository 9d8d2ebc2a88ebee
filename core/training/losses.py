"""Loss functions the learner's ``train_step`` accepts, and the protocol they follow.

A loss is split in two so the learner can normalise globally (docs/algorithms.md):

* ``normalizer(micro_batches) -> float``: this rank's share of the denominator ``D`` of one
  optimiser step, computed from all of its micro-batches at once. The learner SUM-all-reduces
  it over data-parallel ranks.
* ``__call__(micro, outputs, normalizer) -> (loss, stats)``: the loss of one micro-batch divided
  by the *global* ``D``. ``outputs`` is the model's ``[n, t]`` per-token output for the
  micro-batch (log-probs for a policy, values for a critic), aligned like every batch tensor.
  ``stats`` are detached 0-dim means over the micro-batch's loss tokens, except keys ending in
  ``_max`` / ``_min`` (maxima / minima) and ``_loss`` (loss terms divided by the global ``D``,
  which the learner sums); every call must return the same keys.

A loss with ``needs_entropy = True`` finds the per-token entropy (with gradient) in the
micro-batch field ``"entropy"``. A loss whose examples span several rows (DPO: a chosen row
then its rejected row) sets ``rows_per_example``: the learner keeps each example's rows together
and in order in one micro-batch, and averages its statistics over examples instead of tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from core.algorithms import (
    AlgorithmConfig,
    aggregate_loss,
    dpo_loss,
    global_normalizer,
    kl_penalty,
    loglinear_proximal_logprobs,
    masked_mean,
    reward_model_loss,
    sft_loss,
    value_loss,
)
from core.algorithms.objectives import PolicyInputs, resolve_objective
from core.models.value_model import last_token_values
from core.training.batch import TrainBatch
from core.training.mismatch import MismatchMonitor

Tensor = torch.Tensor
LossOutput = tuple[Tensor, dict[str, Tensor]]


@runtime_checkable
class LossFn(Protocol):
    """What ``Learner.train_step`` calls (see the module docstring)."""

    needs_entropy: bool

    def normalizer(self, micro_batches: Sequence[TrainBatch]) -> float: ...

    def __call__(self, micro: TrainBatch, outputs: Tensor, normalizer: float) -> LossOutput: ...


def _masks(micro_batches: Sequence[TrainBatch]) -> list[Tensor]:
    return [m.loss_mask for m in micro_batches]


def _check_norm_constant(aggregation: str, norm_constant: float | None, field_name: str) -> None:
    if aggregation == "seq-mean-token-sum-norm" and norm_constant is None:
        # Micro-batches are trimmed to their own widths, so "the padded width" is not one number.
        raise ValueError(
            f"{field_name} must be set for loss_aggregation='seq-mean-token-sum-norm' in the "
            "learner (e.g. the generation budget max_new_tokens)"
        )


@dataclass
class _MaskAggregatedLoss:
    """A loss whose normaliser depends only on the loss masks and the aggregation mode."""

    aggregation: str = "token-mean"
    norm_constant: float | None = None
    needs_entropy: bool = False

    def __post_init__(self) -> None:
        _check_norm_constant(self.aggregation, self.norm_constant, "norm_constant")

    def normalizer(self, micro_batches: Sequence[TrainBatch]) -> float:
        return global_normalizer(
            _masks(micro_batches), self.aggregation, norm_constant=self.norm_constant
        )


@dataclass
class SFTLoss(_MaskAggregatedLoss):
    """Masked negative log-likelihood (``core.algorithms.sft_loss``)."""

    def __call__(self, micro: TrainBatch, outputs: Tensor, normalizer: float) -> LossOutput:
        loss = sft_loss(
            outputs,
            micro.loss_mask,
            aggregation=self.aggregation,
            normalizer=normalizer,
            norm_constant=self.norm_constant,
        )
        return loss, {"nll": masked_mean(-outputs.detach(), micro.loss_mask)}


@dataclass
class _PairLoss:
    """A loss over rows in (chosen, rejected) pairs: each pair whole in one micro-batch, ``D``
    the number of pairs."""

    needs_entropy: bool = False
    rows_per_example: int = 2

    def normalizer(self, micro_batches: Sequence[TrainBatch]) -> float:
        return sum(len(m) for m in micro_batches) / 2


@dataclass
class DPOLoss(_PairLoss):
    """DPO/IPO (``core.algorithms.dpo_loss``) on rows in pairs: row ``2i`` is a pair's chosen
    answer, row ``2i+1`` its rejected one; the field ``ref_logprobs`` holds the frozen
    reference's per-token log-probs. Sequence log-probs are sums over the answer's loss tokens.
    ``nll_coef`` > 0 adds that times the chosen answer's per-token
    NLL (RPO, Pang et al., arXiv 2404.19733), which keeps the chosen answers likely."""

    beta: float = 0.1
    kind: str = "sigmoid"
    nll_coef: float = 0.0

    def __call__(self, micro: TrainBatch, outputs: Tensor, normalizer: float) -> LossOutput:
        policy = (outputs * micro.loss_mask).sum(-1)
        reference = (micro["ref_logprobs"] * micro.loss_mask).sum(-1)
        loss, stats = dpo_loss(
            policy[0::2], policy[1::2], reference[0::2], reference[1::2],
            beta=self.beta, kind=self.kind, normalizer=normalizer,
        )  # fmt: skip
        nll = -policy[0::2] / micro.loss_mask[0::2].sum(-1).clamp(min=1)
        if self.nll_coef:
            loss = loss + self.nll_coef * nll.sum() / normalizer
        detached = policy.detach()
        stats.update(chosen_logp=detached[0::2].mean(), rejected_logp=detached[1::2].mean(),
                     chosen_nll=nll.detach().mean())  # fmt: skip
        return loss, stats


@dataclass
class RewardModelLoss(_PairLoss):
    """Bradley–Terry (``core.algorithms.reward_model_loss``) on rows in pairs, as
    :class:`DPOLoss`; ``outputs`` are a value model's ``[n, t]`` values and a row's reward is
    the value at its last token (read from the hidden state of the token before it: the whole
    prompt and answer)."""

    def __call__(self, micro: TrainBatch, outputs: Tensor, normalizer: float) -> LossOutput:
        rewards = last_token_values(outputs, micro.attention_mask)
        loss, stats = reward_model_loss(rewards[0::2], rewards[1::2], normalizer=normalizer)
        detached = rewards.detach()
        stats.update(chosen_reward=detached[0::2].mean(), rejected_reward=detached[1::2].mean())
        return loss, stats


@dataclass(frozen=True)
class ProximalPlan:
    """Where one update takes π_prox from (AReaL's decoupled PPO, arXiv 2505.24298): the one
    place this is decided (:func:`proximal_plan`), read by the learner worker and
    :class:`PolicyLoss`."""

    recompute: bool  # a no-grad pass over the batch before the update gives `proximal_logprobs`
    from_training_pass: bool  # the training pass is π_prox exactly (`proximal_is_current`)

    @property
    def exact_logprobs(self) -> bool:
        """Whether the learner's exact log-probs under the update's starting weights are at
        hand (what the train/inference mismatch check compares with the engine's)."""
        return self.recompute or self.from_training_pass


def proximal_plan(config: AlgorithmConfig, *, has_dropout: bool) -> ProximalPlan:
    """π_prox is the learner's weights before this update. With one optimiser step per update
    (``ppo_n_minibatches=1``) the training forward pass computes exactly that, so the separate
    no-grad pass is needed only when minibatches follow each other, and only for the decoupled
    objective without the log-linear approximation (which needs no pass: see
    :func:`~core.algorithms.loglinear_proximal_logprobs`). Dropout makes the training pass
    random, so a model with dropout always recomputes."""
    one_step = config.ppo_n_minibatches == 1 and not has_dropout
    recompute = config.decoupled and not config.use_loglinear_proximal and not one_step
    return ProximalPlan(recompute=recompute, from_training_pass=one_step)


@dataclass
class PolicyLoss:
    """The policy loss ``config.policy_loss`` names (``core/algorithms/objectives.py``; default
    decoupled PPO) from an ``AlgorithmConfig``, plus its KL and entropy terms.

    Batch fields: ``advantages`` ``[N, T]``; ``proximal_logprobs`` (from
    ``Learner.compute_logprobs`` before the update) when ``config.decoupled`` and not
    ``use_loglinear_proximal`` (which needs ``proximal_version`` instead: the learner's version
    at the start of the update, the version of the weights π_prox stands for); ``ref_logprobs`` when
    ``kl_coef > 0``. Without ``decoupled`` the behaviour log-probs are PPO's π_old.

    ``proximal_is_current=True`` (:attr:`ProximalPlan.from_training_pass`, decided by
    :func:`proximal_plan`) takes π_prox from the training forward pass itself (detached)
    instead of the ``proximal_logprobs`` field. That is exact when the update is a single
    optimiser step (``ppo_n_minibatches=1``): every micro-batch is then evaluated with the
    weights of the start of the step, which is what π_prox is, and the separate no-grad forward
    pass is saved (for a model without dropout: with it the training pass is random).

    ``mismatch``: fed every micro-batch's exact learner log-probs under the update's starting
    weights (the recomputed ``proximal_logprobs``, else the training pass: give a monitor only
    when that pass is exact, i.e. one optimiser step) to compare with the engine's.
    """

    config: AlgorithmConfig
    proximal_version: int | None = None
    proximal_is_current: bool = False
    mismatch: MismatchMonitor | None = None

    def __post_init__(self) -> None:
        cfg = self.config
        _check_norm_constant(cfg.loss_aggregation, cfg.loss_norm_constant, "loss_norm_constant")
        if cfg.decoupled and cfg.use_loglinear_proximal and self.proximal_version is None:
            raise ValueError("use_loglinear_proximal=True needs PolicyLoss(proximal_version=...)")
        self._objective = resolve_objective(cfg.policy_loss)

    @property
    def needs_entropy(self) -> bool:
        return self.config.entropy_coef > 0

    def normalizer(self, micro_batches: Sequence[TrainBatch]) -> float:
        cfg = self.config
        return global_normalizer(
            _masks(micro_batches), cfg.loss_aggregation, norm_constant=cfg.loss_norm_constant
        )

    def _proximal(self, micro: TrainBatch, logprobs: Tensor) -> Tensor:
        cfg = self.config
        if not cfg.decoupled:
            return micro.behaviour_logprobs
        if cfg.use_loglinear_proximal:
            assert self.proximal_version is not None  # checked in __post_init__
            v_prox = self.proximal_version  # the update produces version v_prox + 1
            return loglinear_proximal_logprobs(
                micro.behaviour_logprobs,
                logprobs,
                micro.versions,
                v_prox + 1,
                proximal_version=v_prox,
            )
        if self.proximal_is_current:
            return logprobs.detach()
        if "proximal_logprobs" not in micro:
            raise ValueError(
                "decoupled PPO needs the batch field 'proximal_logprobs' "
                "(learner.compute_logprobs before the update) or use_loglinear_proximal=True"
            )
        return micro["proximal_logprobs"]

    def _term(self, token_values: Tensor, micro: TrainBatch, normalizer: float) -> Tensor:
        cfg = self.config
        return aggregate_loss(
            token_values,
            micro.loss_mask,
            cfg.loss_aggregation,
            normalizer=normalizer,
            norm_constant=cfg.loss_norm_constant,
        )

    def __call__(self, micro: TrainBatch, outputs: Tensor, normalizer: float) -> LossOutput:
        cfg = self.config
        if self.mismatch is not None:
            exact = micro["proximal_logprobs"] if "proximal_logprobs" in micro else outputs
            self.mismatch.add(micro, exact.detach())
        inputs = PolicyInputs(
            logprobs=outputs,
            proximal_logprobs=self._proximal(micro, outputs),
            advantages=micro["advantages"],
            loss_mask=micro.loss_mask,
            behaviour_logprobs=micro.behaviour_logprobs if cfg.decoupled else None,
            normalizer=normalizer,
            algo=cfg,
        )
        loss, stats = self._objective.fn(inputs)
        stats = dict(stats, policy_loss=loss.detach())
        if cfg.kl_coef > 0:
            kl = kl_penalty(outputs, micro["ref_logprobs"], cfg.kl_estimator)
            loss = loss + cfg.kl_coef * self._term(kl, micro, normalizer)
            stats["kl"] = masked_mean(kl.detach(), micro.loss_mask)
        if cfg.entropy_coef > 0:
            entropy = micro["entropy"]
            loss = loss - cfg.entropy_coef * self._term(entropy, micro, normalizer)
            stats["entropy"] = masked_mean(entropy.detach(), micro.loss_mask)
        return loss, stats


@dataclass
class ValueLoss(_MaskAggregatedLoss):
    """Clipped critic loss (``core.algorithms.value_loss``); fields ``old_values``, ``returns``."""

    value_clip: float | None = 0.5

    def __call__(self, micro: TrainBatch, outputs: Tensor, normalizer: float) -> LossOutput:
        return value_loss(
            outputs,
            micro["old_values"],
            micro["returns"],
            micro.loss_mask,
            value_clip=self.value_clip,
            aggregation=self.aggregation,
            normalizer=normalizer,
            norm_constant=self.norm_constant,
        )
