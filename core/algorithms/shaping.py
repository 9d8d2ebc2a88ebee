"""Reward shaping applied before advantage estimation."""

import torch

from core.algorithms.advantages import place_at_last_token
from core.algorithms.kl import kl_penalty
from core.algorithms.masking import as_bool

Tensor = torch.Tensor


def shape_rewards(
    rewards: Tensor, *, bias: float = 0.0, scale: float = 1.0, clip: float | None = None
) -> Tensor:
    """``clip((r + bias) · scale, -clip, clip)``, the order AReaL applies them (arXiv 2505.24298).

    Args:
        rewards: any shape, typically ``[batch]`` outcome rewards.
        clip: symmetric bound after scaling; None = no clipping.
    """
    shaped = (rewards + bias) * scale
    return shaped if clip is None else shaped.clamp(-clip, clip)


def overlong_penalty(
    lengths: Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476, eq. 13), to *add* to the rewards.

    With ``L_max = max_len`` and ``L_cache = buffer_len``::

        R(|y|) = 0                                   if |y| <= L_max - L_cache
               = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
               = -1                                  if |y| > L_max

    times ``penalty_factor``.

    Args:
        lengths: ``[batch]`` response lengths (tokens).
    Returns:
        ``[batch]`` float penalties in ``[-penalty_factor, 0]``.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got {buffer_len=} {max_len=}")
    lengths = lengths.to(torch.get_default_dtype())
    soft = ((max_len - buffer_len) - lengths) / buffer_len
    penalty = torch.where(lengths > max_len, torch.full_like(lengths, -1.0), soft.clamp(max=0.0))
    return penalty * penalty_factor


def kl_penalized_rewards(
    token_rewards_or_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    coef: float,
    kind: str = "k1",
) -> Tensor:
    """KL-in-reward shaping: ``r_t - coef · KL_t`` per response token (InstructGPT,
    arXiv 2203.02155; Ziegler et al., arXiv 1909.08593).

    Args:
        token_rewards_or_rewards: ``[batch, tokens]``, or ``[batch]`` placed on the last token.
        logprobs: ``[batch, tokens]`` log-probs of the sampled tokens under the sampling
            (behaviour) policy; ``ref_logprobs`` the same under the reference policy.
        kind: KL estimator, see ``kl_penalty``.
    Returns:
        ``[batch, tokens]`` token rewards (no gradient), 0 outside the mask.
    """
    rewards = token_rewards_or_rewards
    if rewards.dim() == 1:
        rewards = place_at_last_token(rewards, loss_mask)
    kl = kl_penalty(logprobs.detach(), ref_logprobs.detach(), kind)
    shaped = rewards - coef * kl
    return torch.where(as_bool(loss_mask), shaped, torch.zeros_like(shaped))
