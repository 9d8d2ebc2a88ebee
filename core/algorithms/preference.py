"""Supervised and preference losses: SFT, DPO/IPO, Bradley–Terry reward model."""

import torch
import torch.nn.functional as F

from core.algorithms.aggregation import aggregate_loss

Tensor = torch.Tensor

DPO_KINDS = ("sigmoid", "ipo")


def _mean(values: Tensor, normalizer: float | Tensor | None) -> Tensor:
    """Sum over the batch divided by ``normalizer`` (default the batch size)."""
    denom = values.shape[0] if normalizer is None else normalizer
    if isinstance(denom, Tensor):
        return values.sum() / denom.clamp(min=1e-8)
    return values.sum() / max(float(denom), 1e-8)


def sft_loss(
    logprobs: Tensor,
    loss_mask: Tensor,
    *,
    aggregation: str = "token-mean",
    normalizer: float | Tensor | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Masked negative log-likelihood of the target tokens.

    Args:
        logprobs: ``[batch, tokens]`` log p(target token) (gradient flows).
        loss_mask: ``[batch, tokens]``, 1 on tokens to learn (the response).
        aggregation, normalizer, norm_constant: see ``aggregate_loss``.
    Returns:
        0-dim loss.
    """
    return aggregate_loss(
        -logprobs, loss_mask, aggregation, normalizer=normalizer, norm_constant=norm_constant
    )


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    kind: str = "sigmoid",
    *,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Direct Preference Optimisation (Rafailov et al., arXiv 2305.18290) and IPO (Azar et al.,
    arXiv 2310.12036).

    With ``h = (log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))``:

    * ``sigmoid`` (DPO): ``-log σ(β·h)``;
    * ``ipo``: ``(h - 1/(2β))²``.

    Args:
        *_logps: ``[pairs]`` sequence log-probs (sums over response tokens); ref ones detached.
        beta: inverse temperature β (> 0).
        normalizer: total number of pairs over all micro-batches/ranks (default: this batch).
    Returns:
        ``(loss, stats)``: stats ``chosen_reward`` / ``rejected_reward`` (means of the implicit
        rewards ``β·(log π - log π_ref)``), ``reward_accuracy``, ``reward_margin``.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen = policy_chosen_logps - ref_chosen_logps.detach()
    rejected = policy_rejected_logps - ref_rejected_logps.detach()
    h = chosen - rejected
    if kind == "sigmoid":
        losses = -F.logsigmoid(beta * h)
    elif kind == "ipo":
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO kind {kind!r}; expected one of {DPO_KINDS}")
    with torch.no_grad():
        chosen_reward, rejected_reward = beta * chosen, beta * rejected
        stats = {
            "chosen_reward": chosen_reward.mean(),
            "rejected_reward": rejected_reward.mean(),
            "reward_accuracy": (chosen_reward > rejected_reward).float().mean(),
            "reward_margin": (chosen_reward - rejected_reward).mean(),
        }
    return _mean(losses, normalizer), stats


def reward_model_loss(
    chosen_rewards: Tensor,
    rejected_rewards: Tensor,
    *,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Bradley–Terry pairwise loss ``-log σ(r_chosen - r_rejected)`` (InstructGPT, arXiv
    2203.02155, eq. 1).

    Args:
        chosen_rewards, rejected_rewards: ``[pairs]`` scalar rewards (gradient flows).
        normalizer: total number of pairs over all micro-batches/ranks (default: this batch).
    Returns:
        ``(loss, stats)`` with ``accuracy`` and ``margin`` means.
    """
    diff = chosen_rewards - rejected_rewards
    with torch.no_grad():
        stats = {"accuracy": (diff > 0).float().mean(), "margin": diff.mean()}
    return _mean(-F.logsigmoid(diff), normalizer), stats
