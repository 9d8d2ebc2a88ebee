"""Clipped value (critic) loss, PPO2 style (arXiv 1707.06347; OpenAI baselines ppo2)."""

import torch

from core.algorithms.aggregation import aggregate_loss
from core.algorithms.masking import as_bool, masked_mean

Tensor = torch.Tensor


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    *,
    value_clip: float | None = 0.2,
    aggregation: str = "token-mean",
    normalizer: float | Tensor | None = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``½ · max((V - R)², (V_clip - R)²)`` with ``V_clip = V_old + clip(V - V_old, ±value_clip)``.

    Args:
        values: ``[batch, tokens]`` current critic values (gradient flows).
        old_values: ``[batch, tokens]`` values when the returns were computed (detached).
        returns: ``[batch, tokens]`` targets, e.g. from ``gae_advantages`` (detached).
        loss_mask: ``[batch, tokens]``.
        value_clip: clip range; None = unclipped ``½ (V - R)²``.
        aggregation, normalizer, norm_constant: see ``aggregate_loss``.
    Returns:
        ``(loss, stats)`` with ``value_clip_frac`` (tokens where the clipped term is the larger),
        ``value_mean``, ``return_mean``.
    """
    mask = as_bool(loss_mask)
    old_values = torch.where(mask, old_values.detach(), 0.0)
    returns = torch.where(mask, returns.detach(), 0.0)
    values = torch.where(mask, values, 0.0)
    err_unclipped = (values - returns) ** 2
    if value_clip is None:
        token_loss = 0.5 * err_unclipped
        clipped = torch.zeros_like(mask)
    else:
        values_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        err_clipped = (values_clipped - returns) ** 2
        token_loss = 0.5 * torch.maximum(err_unclipped, err_clipped)
        clipped = mask & (err_clipped > err_unclipped)
    loss = aggregate_loss(
        token_loss, mask, aggregation, normalizer=normalizer, norm_constant=norm_constant
    )
    with torch.no_grad():
        stats = {
            "value_clip_frac": masked_mean(clipped.float(), mask),
            "value_mean": masked_mean(values, mask),
            "return_mean": masked_mean(returns, mask),
        }
    return loss, {k: v.detach() for k, v in stats.items()}
