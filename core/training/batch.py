"""``TrainBatch``: the learner's padded tensor view of a list of trajectories, and how to cut it.

Alignment convention (every per-token tensor follows it)
--------------------------------------------------------
All per-token tensors are ``[N, T]`` and aligned with ``input_ids``: column ``t`` describes token
``input_ids[:, t]``. In particular ``logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t])``
— the same convention as ``Trajectory.logprobs`` from the inference engine. Position 0 is always
a prompt token (nothing predicts it), so its log-prob is defined as 0 and its ``loss_mask`` is 0.
Rows are right-padded: ``attention_mask`` is 1 on real tokens, padding has ``loss_mask`` 0,
log-prob 0 and version -1.

Extra fields
------------
Algorithm inputs computed after collation (advantages, proximal/reference log-probs, old values,
returns, ...) travel in ``fields``: 1-D tensors ``[N]`` are per row, 2-D tensors ``[N, T]`` are
per token (and follow the alignment convention). ``select``/``trim``/``split`` keep them in step
with the core tensors.

Cutting
-------
``split_minibatches`` makes the optimiser-step minibatches (contiguous, whole groups);
``micro_batches`` packs rows under a token budget for gradient accumulation; ``shard_rows`` gives
each data-parallel rank its contiguous part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch

from core.rollout.api import Trajectory

Tensor = torch.Tensor

_TOKEN_TENSORS = ("input_ids", "attention_mask", "loss_mask", "behaviour_logprobs", "versions")
_ROW_TENSORS = ("rewards", "prompt_lens")


@dataclass
class TrainBatch:
    """Right-padded tensors for ``N`` sequences of width ``T`` (see the module docstring)."""

    input_ids: Tensor  # [N, T] int64, padded with the tokenizer's pad id
    attention_mask: Tensor  # [N, T] int64, 1 on real tokens
    loss_mask: Tensor  # [N, T] float32, 1 on tokens the policy generated
    behaviour_logprobs: Tensor  # [N, T] float32, the engine's log-probs (0 off the mask)
    versions: Tensor  # [N, T] int64, weight version that generated each token (-1 = none)
    rewards: Tensor  # [N] float32
    prompt_lens: Tensor  # [N] int64
    fields: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, t = self.input_ids.shape
        for name in _TOKEN_TENSORS:
            if getattr(self, name).shape != (n, t):
                raise ValueError(
                    f"TrainBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {(n, t)}"
                )
        for name in _ROW_TENSORS:
            if getattr(self, name).shape != (n,):
                raise ValueError(
                    f"TrainBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {(n,)}"
                )
        for name, value in self.fields.items():
            if (
                value.shape[:1] != (n,)
                or value.dim() not in (1, 2)
                or (value.dim() == 2 and value.shape[1] != t)
            ):
                raise ValueError(
                    f"field {name!r} has shape {tuple(value.shape)}: expected [{n}] or [{n}, {t}]"
                )

    # --- shape ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        """Padded length ``T``."""
        return self.input_ids.shape[1]

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int(self.attention_mask.sum())

    @property
    def n_loss_tokens(self) -> int:
        return int((self.loss_mask != 0).sum())

    @property
    def seq_lens(self) -> Tensor:
        """``[N]`` real length of each row."""
        return self.attention_mask.sum(-1)

    # --- access ---------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Tensor:
        """An extra field by name, with a message that lists what is there."""
        try:
            return self.fields[name]
        except KeyError:
            raise KeyError(
                f"TrainBatch has no field {name!r}; fields: {sorted(self.fields)}"
            ) from None

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def with_fields(self, **tensors: Tensor) -> TrainBatch:
        """A shallow copy with ``tensors`` added to (or replacing) the extra fields."""
        return replace(self, fields={**self.fields, **tensors})

    def _map(self, token_fn, row_fn) -> TrainBatch:
        core = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "fields"}
        mapped = {k: token_fn(v) if k in _TOKEN_TENSORS else row_fn(v) for k, v in core.items()}
        extra = {k: token_fn(v) if v.dim() == 2 else row_fn(v) for k, v in self.fields.items()}
        return TrainBatch(**mapped, fields=extra)

    def select(self, rows: Tensor | Sequence[int] | slice) -> TrainBatch:
        """The rows ``rows`` (indices, bool mask or slice), in that order."""
        if not isinstance(rows, slice):
            rows = torch.as_tensor(rows)
            if rows.dtype != torch.bool:
                rows = rows.long()
        return self._map(lambda v: v[rows], lambda v: v[rows])

    def trim(self) -> TrainBatch:
        """Drop trailing columns that are padding in every row (keeps at least one column)."""
        width = max(int(self.seq_lens.max()), 1) if len(self) else 1
        if width == self.width:
            return self
        return self._map(lambda v: v[:, :width], lambda v: v)

    def to(self, device: torch.device | str) -> TrainBatch:
        return self._map(lambda v: v.to(device), lambda v: v.to(device))


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> TrainBatch:
    """Right-pad ``trajectories`` into a ``TrainBatch`` (see the alignment convention above)."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    width = max(len(t.input_ids) for t in trajectories)
    n = len(trajectories)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.float32)
    logprobs = torch.zeros((n, width), dtype=torch.float32)
    versions = torch.full((n, width), -1, dtype=torch.long)
    for i, traj in enumerate(trajectories):
        _check_trajectory(traj, i)
        length = len(traj.input_ids)
        input_ids[i, :length] = torch.tensor(traj.input_ids, dtype=torch.long)
        attention[i, :length] = 1
        loss_mask[i, :length] = torch.tensor(traj.loss_mask, dtype=torch.float32)
        logprobs[i, :length] = torch.tensor(traj.logprobs, dtype=torch.float32)
        versions[i, :length] = torch.tensor(traj.versions, dtype=torch.long)
    # Off-mask log-probs are meaningless to the losses; keep them exactly 0 as documented.
    logprobs = torch.where(loss_mask != 0, logprobs, 0.0)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        behaviour_logprobs=logprobs,
        versions=versions,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        prompt_lens=torch.tensor([t.prompt_len for t in trajectories], dtype=torch.long),
    )


def budget_lengths(trajectories: Sequence[Trajectory], width: int) -> Tensor:
    """``[N, width]``: at the last generated token of each budgeted call, the tokens that call
    generated (``Trajectory.call_lengths``, else the row's generated tokens as one call); 0
    elsewhere. DAPO's overlong penalty is a sum over these entries."""
    out = torch.zeros((len(trajectories), width), dtype=torch.float32)
    for i, traj in enumerate(trajectories):
        generated = [t for t, m in enumerate(traj.loss_mask) if m]
        calls = traj.call_lengths if traj.call_lengths is not None else [len(generated)]
        end = 0
        for n in calls:
            end += n
            if n:
                out[i, generated[end - 1]] = n
    return out


def _check_trajectory(traj: Trajectory, index: int) -> None:
    if not traj.input_ids:
        raise ValueError(f"trajectory {index} is empty")
    if traj.loss_mask[0]:
        # Nothing predicts the first token, so it can carry no log-prob and no loss.
        raise ValueError(
            f"trajectory {index}: loss_mask[0] must be 0 (position 0 is a prompt token)"
        )
    if traj.prompt_len < 1:
        raise ValueError(f"trajectory {index}: prompt_len={traj.prompt_len}, need >= 1")


def split_minibatches(batch: TrainBatch, n: int, *, group_size: int = 1) -> list[TrainBatch]:
    """``n`` contiguous minibatches (one optimiser step each) made of whole groups.

    Groups are the runs of equal ids in the row field ``group`` when the batch has one (a group
    of agent episodes trained turn by turn has a varying number of rows), else ``group_size``
    consecutive rows. The minibatches' group counts differ by at most one.
    """
    if n < 1:
        raise ValueError(f"ppo_n_minibatches={n} must be >= 1")
    ids = batch.fields.get("group")
    if ids is None:
        if len(batch) % group_size:
            raise ValueError(f"batch of {len(batch)} rows is not whole groups of {group_size}")
        ids = torch.arange(len(batch)) // group_size
    starts = (torch.cat([torch.tensor([True]), ids[1:] != ids[:-1]]).nonzero()[:, 0].tolist()
              if len(ids) else [])  # fmt: skip
    if n > len(starts):
        raise ValueError(f"cannot split {len(starts)} groups into {n} minibatches")
    bounds = [*starts, len(batch)]
    parts = torch.arange(len(starts)).tensor_split(n)
    return [batch.select(torch.arange(bounds[p[0]], bounds[p[-1] + 1])).trim() for p in parts]


def shard_rows(batch: TrainBatch, rank: int, world_size: int, *, group_size: int = 1) -> TrainBatch:
    """Rank ``rank``'s contiguous share of ``batch`` (whole groups), for data parallelism."""
    return split_minibatches(batch, world_size, group_size=group_size)[rank]


def micro_batch_indices(batch: TrainBatch, max_tokens: int, *, group_size: int = 1) -> list[Tensor]:
    """Row indices of each micro-batch: greedy packing under ``rows × padded length ≤ max_tokens``.

    Rows are taken longest first (so a micro-batch's padded length is its first row's length,
    and little padding is wasted); a row longer than the budget gets a micro-batch to itself.
    Every row appears in exactly one micro-batch. With ``group_size`` g > 1, rows
    ``g·k … g·k+g-1`` (a DPO pair: chosen, rejected) stay together, in order.
    """
    if max_tokens < 1:
        raise ValueError(f"micro_batch_tokens={max_tokens} must be >= 1")
    if group_size < 1 or len(batch) % group_size:
        raise ValueError(f"{len(batch)} rows do not form groups of {group_size}")
    lengths = batch.seq_lens.clamp(min=1).tolist()
    groups = [range(i, i + group_size) for i in range(0, len(batch), group_size)]
    widths = [max(lengths[row] for row in group) for group in groups]
    order = sorted(range(len(groups)), key=lambda k: -widths[k])  # stable: ties keep row order
    packs: list[list[int]] = []
    for k in order:
        if packs and (len(packs[-1]) + 1) * group_size * widths[packs[-1][0]] <= max_tokens:
            packs[-1].append(k)
        else:
            packs.append([k])
    return [
        torch.tensor(sorted(row for k in pack for row in groups[k]), dtype=torch.long)
        for pack in packs
    ]


def micro_batches(batch: TrainBatch, max_tokens: int) -> list[TrainBatch]:
    """The micro-batches of ``micro_batch_indices``, each trimmed to its own padded length."""
    return [batch.select(rows).trim() for rows in micro_batch_indices(batch, max_tokens)]


def scatter_rows(
    parts: Sequence[Tensor], indices: Sequence[Tensor], n_rows: int, width: int
) -> Tensor:
    """Reassemble per-micro-batch ``[n_i, T_i]`` outputs into ``[n_rows, width]`` (zero padded)."""
    if not parts:
        return torch.zeros((n_rows, width))
    out = parts[0].new_zeros((n_rows, width))
    for part, rows in zip(parts, indices, strict=True):
        out[rows.to(out.device), : part.shape[1]] = part
    return out
