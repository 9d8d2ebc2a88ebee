"""Teacher-forced log-probs match a plain HF forward pass and ignore right padding."""

from __future__ import annotations

import pytest
import torch

from core.models import load_model
from core.training import collate, token_logprobs, token_logprobs_and_entropy
from tests.core.training.helpers import make_trajectories

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(model_dir)


@pytest.fixture(scope="module")
def batch(tokenizer):
    return collate(make_trajectories(tokenizer, 5, seed=3), tokenizer.pad_token_id)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@torch.no_grad()
def test_matches_hand_computed_log_softmax(model, batch, temperature: float) -> None:
    got = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature)
    t = temperature or 1.0  # greedy is scored at T = 1
    for i in range(len(batch)):
        n = int(batch.seq_lens[i])
        ids = batch.input_ids[i : i + 1, :n]
        log_p = torch.log_softmax(model(ids).logits.float() / t, dim=-1)[0]
        # Engine convention: log p(ids[t] | ids[:t]) lives in column t, column 0 is 0.
        expected = torch.cat([torch.zeros(1), log_p[:-1].gather(-1, ids[0, 1:, None])[:, 0]])
        torch.testing.assert_close(got[i, :n], expected, atol=1e-5, rtol=0)
        assert torch.all(got[i, n:] == 0)


@torch.no_grad()
def test_right_padding_does_not_change_logprobs(model, batch) -> None:
    padded = token_logprobs(model, batch.input_ids, batch.attention_mask)
    for i in range(len(batch)):
        n = int(batch.seq_lens[i])
        alone = token_logprobs(
            model, batch.input_ids[i : i + 1, :n], batch.attention_mask[i : i + 1, :n]
        )
        torch.testing.assert_close(padded[i : i + 1, :n], alone, atol=1e-5, rtol=0)
    assert batch.seq_lens.min() < batch.width  # the batch really is ragged


@torch.no_grad()
def test_entropy_matches_hand_computation(model, batch) -> None:
    logprobs, entropy = token_logprobs_and_entropy(
        model, batch.input_ids, batch.attention_mask, 0.8
    )
    torch.testing.assert_close(
        logprobs, token_logprobs(model, batch.input_ids, batch.attention_mask, 0.8)
    )
    p = torch.softmax(model(batch.input_ids, attention_mask=batch.attention_mask).logits / 0.8, -1)
    expected = -(p * p.log()).sum(-1)[:, :-1]
    mask = batch.attention_mask[:, 1:].bool()
    torch.testing.assert_close(entropy[:, 1:][mask], expected[mask], atol=1e-5, rtol=0)
    assert torch.all(entropy[:, 0] == 0) and torch.all(entropy[~batch.attention_mask.bool()] == 0)
