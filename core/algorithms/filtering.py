"""DAPO dynamic sampling: drop groups that carry no learning signal (arXiv 2503.14476, §3.2)."""

import torch

Tensor = torch.Tensor


def filter_uniform_groups(
    rewards: Tensor, group_size: int, *, atol: float = 0.0
) -> tuple[Tensor, dict[str, int]]:
    """Keep only groups whose rewards are not all equal.

    A group whose rewards are all equal (all solved or all failed) has zero group-relative
    advantage everywhere, so it adds no gradient but dilutes the batch. DAPO over-samples and
    keeps only informative groups; this function marks them.

    Args:
        rewards: ``[batch]`` outcome rewards, ``group_size`` consecutive sequences per prompt.
        atol: groups with ``max - min <= atol`` count as uniform.
    Returns:
        ``(keep, stats)``: ``keep`` is a ``[batch]`` bool mask (use ``rewards[keep]`` or
        ``keep.nonzero()``); ``stats`` holds ints ``n_groups``, ``n_kept``, ``n_dropped``,
        ``n_dropped_max`` / ``n_dropped_min`` (uniform groups at the batch's best / worst
        reward, e.g. all-correct / all-wrong for binary rewards).
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}"
        )
    groups = rewards.reshape(-1, group_size)
    spread = groups.amax(dim=-1) - groups.amin(dim=-1)
    uniform = spread <= atol
    keep = (~uniform).repeat_interleave(group_size)
    n_groups = groups.shape[0]
    n_dropped = int(uniform.sum())
    if rewards.numel() > 0:
        group_value = groups[:, 0]
        n_dropped_max = int((uniform & (group_value >= rewards.max())).sum())
        n_dropped_min = int((uniform & (group_value <= rewards.min())).sum())
    else:
        n_dropped_max = n_dropped_min = 0
    stats = {
        "n_groups": n_groups,
        "n_kept": n_groups - n_dropped,
        "n_dropped": n_dropped,
        "n_dropped_max": n_dropped_max,
        "n_dropped_min": n_dropped_min,
    }
    return keep, stats
