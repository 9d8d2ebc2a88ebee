"""Masked reductions over padded ``[batch, tokens]`` tensors.

Every function here treats ``loss_mask`` as 0/1 (float or bool): entries where the mask is zero
are ignored, even when the tensor holds ``nan``/``inf`` there (padding is never multiplied in).
"""

import torch

Tensor = torch.Tensor


def as_bool(loss_mask: Tensor) -> Tensor:
    """``loss_mask != 0`` as a bool tensor of the same shape."""
    return loss_mask if loss_mask.dtype == torch.bool else loss_mask != 0


def masked_sum(values: Tensor, loss_mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where the mask is set (over ``dim``, or everything)."""
    kept = torch.where(as_bool(loss_mask), values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, loss_mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the masked entries; 0 where nothing is masked in."""
    count = as_bool(loss_mask).sum() if dim is None else as_bool(loss_mask).sum(dim)
    return masked_sum(values, loss_mask, dim) / count.clamp(min=1)


def masked_max(values: Tensor, loss_mask: Tensor) -> Tensor:
    """Largest masked-in value (0-dim); 0 when the mask is empty. No host sync."""
    mask = as_bool(loss_mask)
    best = torch.where(mask, values, torch.full_like(values, -torch.inf)).amax()
    return torch.where(mask.any(), best, torch.zeros_like(best))


def masked_min(values: Tensor, loss_mask: Tensor) -> Tensor:
    """Smallest masked-in value (0-dim); 0 when the mask is empty. No host sync."""
    mask = as_bool(loss_mask)
    least = torch.where(mask, values, torch.full_like(values, torch.inf)).amin()
    return torch.where(mask.any(), least, torch.zeros_like(least))


def masked_whiten(values: Tensor, loss_mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over all masked entries; 0 outside the mask.

    ``var`` is the unbiased (Bessel-corrected) variance of the masked entries, as in verl's
    ``masked_whiten``; with a single masked entry it is taken as 0.
    """
    mask = as_bool(loss_mask)
    mean = masked_mean(values, mask)
    n = mask.sum()
    centred = torch.where(mask, values - mean, torch.zeros_like(values))
    var = (centred**2).sum() / (n - 1).clamp(min=1)
    return torch.where(mask, centred * torch.rsqrt(var + eps), torch.zeros_like(values))


def nonempty_rows(loss_mask: Tensor) -> Tensor:
    """``[batch]`` bool: the rows that have at least one masked-in token."""
    return as_bool(loss_mask).any(dim=-1)


def last_token_index(loss_mask: Tensor) -> Tensor:
    """``[batch]`` long: position of the last masked-in token of each row (0 for empty rows)."""
    mask = as_bool(loss_mask)
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, torch.zeros_like(positions)).amax(dim=-1)
