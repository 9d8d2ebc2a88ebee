"""Packed sequences change no numbers: the same log-probs, loss, gradients and weights as the
padded micro-batch, with fewer rows through the model."""

from __future__ import annotations

import pytest
import torch

from core.models import load_model
from core.training.logprobs import logprobs_from_logits
from core.training.packing import first_fit, pack_rows, unpack
from tests.core.training.helpers import SGD_LIKE, make_batch, max_abs_diff, ppo_batch, ppo_run

pytestmark = pytest.mark.unit


def test_first_fit_puts_every_sequence_in_one_bin_under_capacity() -> None:
    lengths = [7, 3, 9, 1, 5, 5, 2, 8]
    bins = first_fit(lengths, capacity=10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert bins == [[2, 3], [7, 6], [0, 1], [4, 5]]  # longest first: 9+1, 8+2, 7+3, 5+5
    assert first_fit([4, 4], capacity=3) == [[0], [1]]  # too long: a bin of its own


@pytest.mark.parametrize("width", [None, 64], ids=["same-width", "wider-rows"])
def test_packed_forward_matches_the_padded_one(model_dir, tokenizer, width) -> None:
    batch = make_batch(tokenizer, 12, seed=3)
    model = load_model(model_dir)
    packed = pack_rows(batch.input_ids, batch.attention_mask, tokenizer.pad_token_id, width=width)
    assert packed.n_rows < len(batch)  # sequences really share rows
    padded_logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                          use_cache=False).logits  # fmt: skip
    packed_logits = unpack(model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                                 use_cache=False).logits, packed)  # fmt: skip
    padded_lp = logprobs_from_logits(padded_logits, batch.input_ids, batch.attention_mask)
    packed_lp = logprobs_from_logits(packed_logits, batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(packed_lp, padded_lp, atol=2e-5, rtol=0)
    # The packed rows hold every real token once, in order, at its own position.
    flat = packed.input_ids.flatten()[packed.index]
    assert torch.equal(flat * batch.attention_mask, batch.input_ids * batch.attention_mask)


def test_packed_learner_steps_equal_padded_ones(model_dir, tokenizer) -> None:
    """Two PPO steps (KL, entropy) with and without packing: same statistics and weights."""
    batch = ppo_batch(model_dir, tokenizer, 12, seed=3)
    assert pack_rows(batch.input_ids, batch.attention_mask).n_rows < len(batch)
    padded = ppo_run(model_dir, batch, learner_kw=SGD_LIKE, micro_batch_tokens=10_000)
    packed = ppo_run(model_dir, batch, learner_kw={**SGD_LIKE, "pack_sequences": True},
                     micro_batch_tokens=10_000)  # fmt: skip
    for a, b in zip(padded["stats"], packed["stats"], strict=True):
        for key in ("loss", "policy_loss", "grad_norm", "kl", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    assert max_abs_diff(padded["state"], packed["state"]) <= 1e-5
