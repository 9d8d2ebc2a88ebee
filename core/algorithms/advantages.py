"""Advantage estimators.

Outcome estimators (GRPO, RLOO) take one reward per sequence ``[batch]`` and return one advantage
per sequence; ``broadcast_to_tokens`` spreads it over the response. A *group* is ``group_size``
consecutive sequences sampled from the same prompt. Token estimators (REINFORCE++, GAE) work on
``[batch, tokens]`` and skip masked-out positions: those neither receive a return nor count as a
discounting step (so multi-turn masks with holes discount over response tokens only).
"""

import torch

from core.algorithms.masking import as_bool, last_token_index, masked_whiten

Tensor = torch.Tensor


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """``[batch]`` -> ``[n_groups, group_size]``, checking the batch splits into whole groups."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [batch], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(f"batch of {rewards.shape[0]} does not split into groups of {group_size}")
    return rewards.reshape(-1, group_size)


def place_at_last_token(rewards: Tensor, loss_mask: Tensor) -> Tensor:
    """Put a per-sequence reward ``[batch]`` on the last response token: ``[batch, tokens]``.

    Rows without response tokens get nothing.
    """
    mask = as_bool(loss_mask)
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = torch.arange(mask.shape[0], device=mask.device)
    out[rows, last_token_index(mask)] = rewards
    return torch.where(mask, out, torch.zeros_like(out))


def broadcast_to_tokens(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """Sequence values ``[batch]`` -> ``[batch, tokens]``, equal on response tokens, 0 elsewhere."""
    mask = as_bool(loss_mask)
    full = seq_values.unsqueeze(-1).expand(mask.shape)
    return torch.where(mask, full, torch.zeros_like(full))


def grpo_advantages(
    rewards: Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO group-relative advantages (DeepSeekMath, arXiv 2402.03300).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` with the unbiased per-group std;
    ``normalize_std=False`` gives ``A_i = r_i - mean_g(r)`` (Dr.GRPO, arXiv 2503.20783).
    With ``group_size == 1`` every advantage is 0.

    Args:
        rewards: ``[batch]`` outcome rewards, groups consecutive.
        group_size: sequences per prompt.
    Returns:
        ``[batch]`` advantages.
    """
    groups = _grouped(rewards, group_size)
    centred = groups - groups.mean(dim=-1, keepdim=True)
    if normalize_std and group_size > 1:
        centred = centred / (groups.std(dim=-1, keepdim=True) + eps)
    return centred.reshape(-1)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE Leave-One-Out advantages (Ahmadian et al., arXiv 2402.14740).

    ``A_i = r_i - mean_{j != i} r_j = G/(G-1) · (r_i - mean_g(r))`` within each group of ``G``.

    Args:
        rewards: ``[batch]`` outcome rewards, groups consecutive; ``group_size >= 2``.
    Returns:
        ``[batch]`` advantages.
    """
    if group_size < 2:
        raise ValueError("rloo_advantages needs group_size >= 2")
    groups = _grouped(rewards, group_size)
    others_mean = (groups.sum(dim=-1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others_mean).reshape(-1)


def discounted_returns(token_rewards: Tensor, loss_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_t = r_t + gamma · G_{t'}`` where ``t'`` is the next response token (0 at the end).

    Args:
        token_rewards: ``[batch, tokens]``; values at masked-out positions are ignored.
        loss_mask: ``[batch, tokens]``.
    Returns:
        ``[batch, tokens]`` returns, 0 outside the mask.
    """
    mask = as_bool(loss_mask)
    rewards = torch.where(mask, token_rewards, torch.zeros_like(token_rewards))
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return torch.where(mask, returns, torch.zeros_like(returns))


def reinforce_pp_advantages(
    token_rewards_or_rewards: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float = 1.0,
    baseline: str = "none",
    group_size: int | None = None,
    eps: float = 1e-8,
) -> Tensor:
    """REINFORCE++ advantages (Hu et al., arXiv 2501.03262): whitened discounted token returns.

    1. A ``[batch]`` reward is first placed on each sequence's last response token.
    2. ``baseline="group"`` (REINFORCE++-baseline): subtract from each sequence's last-token
       reward the mean over its group of the sequences' total rewards ``Σ_t r_t``. For outcome
       rewards this is ``r_i - mean_g(r)``.
    3. Discounted returns ``G_t`` (``discounted_returns``).
    4. Whiten ``G`` over all response tokens of the batch (``masked_whiten``).

    Args:
        token_rewards_or_rewards: ``[batch, tokens]`` token rewards or ``[batch]`` outcomes.
        loss_mask: ``[batch, tokens]``.
        baseline: ``"none"`` | ``"group"`` (needs ``group_size``).
    Returns:
        ``[batch, tokens]`` advantages, 0 outside the mask.
    """
    rewards = token_rewards_or_rewards
    if rewards.dim() == 1:
        rewards = place_at_last_token(rewards, loss_mask)
    if baseline == "group":
        if group_size is None:
            raise ValueError("baseline='group' needs group_size")
        totals = torch.where(as_bool(loss_mask), rewards, torch.zeros_like(rewards)).sum(-1)
        group_mean = _grouped(totals, group_size).mean(dim=-1).repeat_interleave(group_size)
        rewards = rewards - place_at_last_token(group_mean, loss_mask)
    elif baseline != "none":
        raise ValueError(f"unknown baseline {baseline!r}; expected 'none' or 'group'")
    return masked_whiten(discounted_returns(rewards, loss_mask, gamma), loss_mask, eps)


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al., arXiv 1506.02438), for PPO.

    Over the response tokens of each row (masked-out positions skipped, bootstrap 0 after the
    last one): ``δ_t = r_t + γ V_{t'} - V_t`` and ``A_t = δ_t + γ λ A_{t'}``, ``t'`` the next
    response token. ``returns = A + V`` (the critic target, from the un-whitened ``A``).

    Args:
        token_rewards: ``[batch, tokens]`` (use ``place_at_last_token`` for outcome rewards).
        values: ``[batch, tokens]`` critic values ``V(s_t)`` (no gradient is taken).
        loss_mask: ``[batch, tokens]``.
        whiten: whiten the advantages over the batch (verl's PPO default).
    Returns:
        ``(advantages, returns)``, both ``[batch, tokens]``, 0 outside the mask.
    """
    mask = as_bool(loss_mask)
    zeros = torch.zeros_like(token_rewards)
    rewards = torch.where(mask, token_rewards, zeros)
    values = torch.where(mask, values.detach(), zeros)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        next_adv = torch.where(mask[:, t], adv_t, next_adv)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        advantages[:, t] = next_adv
    advantages = torch.where(mask, advantages, zeros)
    returns = torch.where(mask, advantages + values, zeros)
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns
