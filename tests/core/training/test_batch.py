"""collate / TrainBatch / minibatch, micro-batch and rank splitting."""

from __future__ import annotations

import pytest
import torch

from core.rollout.api import Trajectory
from core.training import (
    collate,
    micro_batch_indices,
    micro_batches,
    scatter_rows,
    shard_rows,
    split_minibatches,
)
from tests.core.training.helpers import make_trajectories

pytestmark = pytest.mark.unit

PAD = 0


def _traj(ids: list[int], prompt_len: int, version: int = 3, reward: float = 1.0) -> Trajectory:
    n = len(ids)
    mask = [0] * prompt_len + [1] * (n - prompt_len)
    return Trajectory(
        input_ids=ids,
        loss_mask=mask,
        logprobs=[-0.5 * m for m in mask],
        versions=[version if m else -1 for m in mask],
        reward=reward,
        prompt_len=prompt_len,
    )


def test_collate_pads_right_and_keeps_alignment() -> None:
    trajs = [_traj([5, 6, 7, 8, 9], 2), _traj([5, 6, 7], 1, version=4, reward=0.0)]
    batch = collate(trajs, PAD)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 5, [1, 1, 1, 0, 0]]
    # Column t describes token t: the response starts at prompt_len, position 0 never has loss.
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert batch.behaviour_logprobs.tolist() == [[0, 0, -0.5, -0.5, -0.5], [0, -0.5, -0.5, 0, 0]]
    assert batch.versions.tolist() == [[-1, -1, 3, 3, 3], [-1, 4, 4, -1, -1]]
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.prompt_lens.tolist() == [2, 1]
    assert batch.input_ids.dtype == torch.long and batch.loss_mask.dtype == torch.float32
    assert (len(batch), batch.width, batch.n_tokens, batch.n_loss_tokens) == (2, 5, 8, 5)


def test_collate_rejects_loss_on_first_token() -> None:
    bad = Trajectory([1, 2], [1, 1], [-1.0, -1.0], [0, 0], 0.0, prompt_len=0)
    with pytest.raises(ValueError, match="position 0"):
        collate([bad], PAD)
    with pytest.raises(ValueError, match="at least one"):
        collate([], PAD)


def test_fields_are_validated_and_follow_selection(tokenizer) -> None:
    batch = collate(make_trajectories(tokenizer, 6), tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="field 'adv'"):
        batch.with_fields(adv=torch.zeros(6, batch.width + 1))
    per_token = torch.arange(6 * batch.width, dtype=torch.float32).view(6, -1)
    batch = batch.with_fields(adv=per_token, row=torch.arange(6.0))
    picked = batch.select(torch.tensor([False, True, False, False, True, False]))
    assert picked["row"].tolist() == [1.0, 4.0]
    assert torch.equal(picked["adv"], per_token[[1, 4]])
    with pytest.raises(KeyError, match="no field 'nope'"):
        batch["nope"]


def test_micro_batches_respect_budget_and_cover_every_row_once(tokenizer) -> None:
    batch = collate(make_trajectories(tokenizer, 13, seed=1), tokenizer.pad_token_id)
    batch = batch.with_fields(row=torch.arange(13.0))
    lengths = batch.seq_lens
    for budget in (1, 40, 64, 100, 10_000):
        indices = micro_batch_indices(batch, budget)
        assert sorted(torch.cat(indices).tolist()) == list(range(13))
        for rows, micro in zip(indices, micro_batches(batch, budget)):
            assert micro.width == int(lengths[rows].max())  # trimmed to its own longest row
            assert len(rows) == 1 or len(rows) * micro.width <= budget
            assert micro["row"].tolist() == rows.tolist()
            assert torch.equal(micro.input_ids, batch.input_ids[rows, : micro.width])
    assert len(micro_batch_indices(batch, 10_000)) == 1
    assert len(micro_batch_indices(batch, 1)) == 13  # longer than the budget: one row each


def test_scatter_rows_reassembles_micro_batch_outputs(tokenizer) -> None:
    batch = collate(make_trajectories(tokenizer, 7, seed=2), tokenizer.pad_token_id)
    full = torch.randn(7, batch.width) * batch.attention_mask
    indices = micro_batch_indices(batch, 50)
    parts = [full[rows, : int(batch.seq_lens[rows].max())] for rows in indices]
    assert torch.equal(scatter_rows(parts, indices, 7, batch.width), full)


def test_split_minibatches_is_contiguous_and_keeps_groups(tokenizer) -> None:
    batch = collate(make_trajectories(tokenizer, 12), tokenizer.pad_token_id)
    batch = batch.with_fields(row=torch.arange(12.0))
    parts = split_minibatches(batch, 3, group_size=2)
    assert [p["row"].tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    uneven = split_minibatches(batch, 4, group_size=3)
    assert [len(p) for p in uneven] == [3, 3, 3, 3]
    lopsided = split_minibatches(batch, 2, group_size=4)  # 3 groups into 2
    assert [p["row"].tolist()[0] for p in lopsided] == [0, 8] and len(lopsided[0]) == 8
    assert shard_rows(batch, 1, 2, group_size=2)["row"].tolist() == [6, 7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="whole groups"):
        split_minibatches(batch, 2, group_size=5)
    with pytest.raises(ValueError, match="into 7 minibatches"):
        split_minibatches(batch, 7, group_size=2)


def test_groups_of_varying_rows_split_whole(tokenizer) -> None:
    """Agent episodes trained turn by turn: groups of 5, 2, 3 and 2 rows (the ``group`` field)
    split whole, whatever ``group_size`` says."""
    batch = collate(make_trajectories(tokenizer, 12), tokenizer.pad_token_id)
    group = torch.tensor([0] * 5 + [1] * 2 + [2] * 3 + [3] * 2)
    batch = batch.with_fields(row=torch.arange(12.0), group=group)
    parts = split_minibatches(batch, 2, group_size=4)
    assert [p["row"].tolist() for p in parts] == [list(range(7)), list(range(7, 12))]
    assert [p["group"].unique().tolist() for p in split_minibatches(batch, 3)] == [[0, 1], [2], [3]]
    assert shard_rows(batch, 0, 2, group_size=4)["group"].tolist() == [0] * 5 + [1] * 2
    with pytest.raises(ValueError, match="cannot split 4 groups into 5"):
        split_minibatches(batch, 5)
