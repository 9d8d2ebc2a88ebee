"""A decoding batch whose rows can leave and join without re-prefilling the others.

Rows are left-padded: every row's cached keys/values end at the same column, the attention mask
hides each row's padding, and positions are tracked per row. So finished rows can be dropped
(``index_select`` on the batch dimension, then trim columns that are padding in every row) and
new rows, prefilled on their own, can be appended (left-pad the shorter cache with zeros, which
the mask hides, and concatenate). This works on the plain ``DynamicLayer`` caches of
full-attention models; :func:`splice_supported` says when it does not (sliding-window or
quantized layers), and the decoder then re-prefills instead.

The batch's cache layers are :class:`GrowingLayer` layers: a decode step writes its one new column
into spare room at the end of the buffer instead of concatenating a copy of the whole cache, which
on CPU cost as much as the attention itself (a batch of 64 rows at 1,000 columns copies ~130 MB
per step on the tiny model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def left_pad(
    sequences: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` for left-padded ``sequences``."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


def pad_left(t: torch.Tensor, width: int, dim_from_end: int) -> torch.Tensor:
    """``t`` with zeros before its entries along dimension ``-dim_from_end``, up to ``width``
    (keys and values are ``[..., tokens, head_dim]``: ``dim_from_end=2``; masks: 1)."""
    missing = width - t.shape[-dim_from_end]
    spec = [0, 0] * (dim_from_end - 1) + [missing, 0]
    return F.pad(t, spec) if missing else t


class _Filled:
    """A :class:`GrowingLayer` attribute that reads as the filled part of its buffer and is
    assigned as a whole new buffer."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, layer: Any, owner: type | None = None) -> Any:
        return self if layer is None else layer._get(self.name)

    def __set__(self, layer: Any, t: torch.Tensor | None) -> None:
        layer._set(self.name, t)


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer with spare columns: appending writes in place.

    ``keys``/``values`` read as the filled part of their buffers (views); assigning them (as
    :class:`LiveBatch` does when rows leave or join) replaces a buffer, and the next append
    allocates room for at least ``spare`` more columns. So a round's decode steps copy the cache
    about once per ``spare`` steps instead of at every step.
    """

    spare = 64  # columns allocated beyond what an append needs, at least

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        self._filled = {"keys": 0, "values": 0}  # each on its own: they are assigned one by one
        super().__init__()

    def _get(self, name: str) -> torch.Tensor | None:
        buffer = self._buffers[name]
        if buffer is None or buffer.dim() != 4:  # unset, or transformers' empty placeholder
            return buffer
        return buffer[:, :, : self._filled[name]]

    def _set(self, name: str, t: torch.Tensor | None) -> None:
        self._buffers[name] = t
        self._filled[name] = t.shape[-2] if t is not None and t.dim() == 4 else 0

    keys = _Filled()  # type: ignore[assignment]
    values = _Filled()  # type: ignore[assignment]

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        """Take ``keys``/``values`` buffers of which the first ``filled`` columns hold the
        cache: the columns after them are room for appends without a copy."""
        self.is_initialized, self.device = True, keys.device
        for name, buffer in (("keys", keys), ("values", values)):
            self._buffers[name], self._filled[name] = buffer, filled

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._filled["keys"]:
            self.is_initialized, self.device = True, key_states.device
            self.keys, self.values = key_states, value_states  # the first write: no copy
            return key_states, value_states
        for name, new in (("keys", key_states), ("values", value_states)):
            buffer, start = self._buffers[name], self._filled[name]
            assert buffer is not None
            end = start + new.shape[-2]
            if end > buffer.shape[-2]:  # no room: move to a larger buffer
                buffer = pad_right(buffer[:, :, :start], end + max(self.spare, end // 4))
                self._buffers[name] = buffer
            buffer[:, :, start:end] = new
            self._filled[name] = end
        return self.keys, self.values  # type: ignore[return-value]


def pad_right(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` (``[B, H, T, D]``) in a new buffer of ``width`` columns, the extra ones empty."""
    out = t.new_empty((*t.shape[:2], width, t.shape[-1]))
    out[:, :, : t.shape[-2]] = t
    return out


def roomy_buffer(like: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """An empty ``[rows, H, width + room, D]`` buffer like ``like`` (``[B, H, T, D]``): the room
    takes the next appends of a :class:`GrowingLayer` without another copy."""
    room = max(GrowingLayer.spare, width // 4)
    return like.new_empty((rows, like.shape[1], width + room, like.shape[3]))


def adopt_layer(
    cache: DynamicCache, index: int, keys: torch.Tensor, values: torch.Tensor, filled: int
) -> None:
    """Make ``keys``/``values`` (their first ``filled`` columns) layer ``index`` of an empty
    ``cache``: in place on a :class:`GrowingLayer`, else through ``update`` (older 5.x
    transformers add layers lazily)."""
    layers = _layers(cache)
    if index < len(layers) and isinstance(layers[index], GrowingLayer):
        layers[index].adopt(keys, values, filled)
    else:
        cache.update(keys[:, :, :filled], values[:, :, :filled], index)


def _store(layer: Any, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
    """Give ``layer`` new buffers whose first ``filled`` columns are its cache."""
    if isinstance(layer, GrowingLayer):
        layer.adopt(keys, values, filled)
    else:
        layer.keys, layer.values = keys[:, :, :filled], values[:, :, :filled]


def growing_cache(config: Any) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are :class:`GrowingLayer`."""
    cache = DynamicCache(config=config)
    if hasattr(cache, "layer_class_to_replicate"):  # layers added lazily (older 5.x)
        cache.layer_class_to_replicate = GrowingLayer
    cache.layers = [
        GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def _layers(cache: DynamicCache) -> list[Any]:
    return list(getattr(cache, "layers", []) or [])


def splice_supported(cache: DynamicCache) -> bool:
    """True when every cache layer is a plain full-attention layer holding tensors."""
    layers = _layers(cache)
    return bool(layers) and all(
        type(layer) in (DynamicLayer, GrowingLayer)
        and isinstance(getattr(layer, "keys", None), torch.Tensor)
        and layer.keys.dim() == 4
        for layer in layers
    )


@dataclass
class LiveBatch:
    """Rows decoding together: ``mask`` covers the cached tokens, ``positions`` is each row's
    last cached position, ``pending`` the tokens sampled but not yet fed to the model."""

    rows: list[Any]  # the engine's per-request objects, in batch order
    cache: DynamicCache
    mask: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, 1]
    pending: torch.Tensor | None = None  # [B]

    def __len__(self) -> int:
        return len(self.rows)

    def advance(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs for feeding ``tokens`` (one per row): ``(ids [B,1], mask, positions)``."""
        ones = torch.ones((len(self), 1), dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        self.positions = self.positions + 1
        self.pending = None
        return tokens[:, None], self.mask, self.positions

    def select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` (in that order) and drop columns that are padding for all."""
        if keep == list(range(len(self.rows))):
            return  # nothing left: avoid copying the cache
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        if self.pending is not None:
            self.pending = self.pending.index_select(0, index)
        first = int(self.mask.any(dim=0).int().argmax())  # first column some row still uses
        self.mask = self.mask[:, first:]
        width = self.mask.shape[1]
        for layer in _layers(self.cache):
            # one copy, straight into a buffer with room for the next decode steps
            buffers = []
            for kept in (layer.keys, layer.values):
                buffer = roomy_buffer(kept, len(keep), width)
                torch.index_select(kept[:, :, first:], 0, index, out=buffer[:, :, :width])
                buffers.append(buffer)
            _store(layer, *buffers, width)

    def extend(self, other: LiveBatch) -> None:
        """Append ``other``'s rows (its pending tokens are not carried: it must have none)."""
        assert self.pending is None and other.pending is None, "feed pending tokens first"
        width = max(self.mask.shape[1], other.mask.shape[1])

        def pad(t: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            return pad_left(t, width, dim_from_end)

        n = len(self.rows)
        self.rows = self.rows + other.rows
        self.mask = torch.cat([pad(self.mask, 1), pad(other.mask, 1)], dim=0)
        self.positions = torch.cat([self.positions, other.positions], dim=0)
        for mine, theirs in zip(_layers(self.cache), _layers(other.cache), strict=True):
            # one copy of each, right-aligned in a buffer with room for the next decode steps;
            # the padding before a shorter cache is zeros (masked, but 0 * NaN would still be NaN)
            buffers = []
            for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
                buffer = roomy_buffer(a, len(self.rows), width)
                for rows, part in ((slice(0, n), a), (slice(n, None), b)):
                    start = width - part.shape[-2]
                    buffer[rows, :, :start] = 0
                    buffer[rows, :, start:width] = part
                buffers.append(buffer)
            _store(mine, *buffers, width)
