"""Sequence packing: the rows of a right-padded micro-batch laid end to end in fewer rows.

A micro-batch of ``N`` rows padded to width ``T`` spends ``N·T`` positions of every linear layer
on ``sum(len)`` real tokens. Packing puts several sequences in one row of the same width (first
fit, longest first) and restarts ``position_ids`` at 0 for each; without an attention mask,
transformers reads the restarts as sequence boundaries (``find_packed_sequence_indices``) and
builds a block-diagonal causal mask, so no token attends across sequences -- only with
``use_cache=False`` (with a cache it assumes one sequence per row). With FlashAttention-2
on GPUs the same position ids drive its varlen kernels; on CPU SDPA gets the block mask.

The model sees each sequence at the positions and with the context it has in the padded
layout, so logits agree with the padded forward up to floating-point summation order (the tests
check log-probs and gradients against it). :func:`unpack` gathers the packed outputs back into
the padded ``[N, T, ...]`` layout that the losses use; padding positions get the packed batch's
first output, which the losses mask out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class PackedRows:
    """A packed layout of a padded ``[N, T]`` batch."""

    input_ids: Tensor  # [B, T], B <= N: sequences end to end, then ``pad_id``
    position_ids: Tensor  # [B, T]: 0, 1, ... restarting at each sequence (and the tail padding)
    index: Tensor  # [N, T]: flat position in [B * T] of each padded position (padding -> 0)

    @property
    def n_rows(self) -> int:
        return self.input_ids.shape[0]


def first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of sequence indices, longest first, each summing to at most ``capacity``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        slot = next((b for b, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            bins.append([i])
            room.append(capacity - lengths[i])
        else:
            bins[slot].append(i)
            room[slot] -= lengths[i]
    return bins


def pack_rows(
    input_ids: Tensor, attention_mask: Tensor, pad_id: int = 0, width: int | None = None
) -> PackedRows:
    """Pack the right-padded rows of ``input_ids`` into as few rows of ``width`` (default: the
    batch's own width) as fit."""
    n, padded_width = input_ids.shape
    width = max(width or padded_width, padded_width)
    lengths = attention_mask.sum(-1).tolist()
    bins = first_fit([max(int(x), 1) for x in lengths], width)
    packed = torch.full((len(bins), width), pad_id, dtype=input_ids.dtype)
    positions = torch.zeros((len(bins), width), dtype=torch.long)
    index = torch.zeros((n, padded_width), dtype=torch.long)
    columns = torch.arange(width)
    for b, rows in enumerate(bins):
        start = 0
        for row in rows:
            length = max(int(lengths[row]), 1)
            packed[b, start : start + length] = input_ids[row, :length]
            positions[b, start : start + length] = columns[:length]
            index[row, :length] = b * width + start + columns[:length]
            start += length
        positions[b, start:] = columns[: width - start]  # the tail: a sequence of its own
    device = input_ids.device
    return PackedRows(packed.to(device), positions.to(device), index.to(device))


def unpack(values: Tensor, packed: PackedRows) -> Tensor:
    """``[B, T, ...]`` outputs of the packed rows -> ``[N, T, ...]`` in the padded layout."""
    flat = values.reshape(-1, *values.shape[2:])
    return flat[packed.index]


def packed_logits(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``[N, T, V]`` logits of right-padded rows, computed on their packed layout."""
    packed = pack_rows(input_ids, attention_mask)
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
    return unpack(out.logits, packed)
