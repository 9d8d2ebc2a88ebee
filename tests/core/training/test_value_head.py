"""Critic learner: value alignment, and what a value-loss step trains."""

from __future__ import annotations

import pytest
import torch

from core.training import Learner, ValueLoss
from tests.core.training.helpers import ADAM, make_batch

pytestmark = pytest.mark.unit


@pytest.fixture
def critic(model_dir) -> Learner:
    return Learner(model_dir, **dict(ADAM, lr=1e-2), micro_batch_tokens=48, with_value_head=True)


def test_compute_values_shape_and_alignment(critic, tokenizer) -> None:
    batch = make_batch(tokenizer, 5, seed=7)
    values = critic.compute_values(batch)
    assert values.shape == batch.input_ids.shape and values.dtype == torch.float32
    assert torch.all(values[:, 0] == 0) and torch.all(values[batch.attention_mask == 0] == 0)
    # values[:, t] = V(prefix before token t) = head(last hidden state at t - 1).
    model = critic.model
    with torch.no_grad():
        for i in range(len(batch)):
            n = int(batch.seq_lens[i])
            hidden = model.backbone(input_ids=batch.input_ids[i : i + 1, :n]).last_hidden_state
            expected = model.value_head(hidden)[0, :, 0]
            torch.testing.assert_close(values[i, 1:n], expected[:-1], atol=1e-5, rtol=0)


def test_value_steps_train_only_trainable_params(critic, tokenizer) -> None:
    batch = make_batch(tokenizer, 6, seed=8)
    old_values = critic.compute_values(batch)
    returns = batch.rewards[:, None] * batch.loss_mask  # outcome reward as the target
    batch = batch.with_fields(old_values=old_values, returns=returns)
    frozen = critic.model.backbone.embed_tokens.weight
    frozen.requires_grad_(False)
    before = {name: p.detach().clone() for name, p in critic.model.named_parameters()}
    loss_fn = ValueLoss(value_clip=None)
    losses = [critic.train_step(batch, loss_fn)["loss"] for _ in range(5)]
    after = dict(critic.model.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == set(before) - {"backbone.embed_tokens.weight"}
    assert {"value_head.weight", "value_head.bias", "backbone.norm.weight"} <= changed
    assert losses[-1] < 0.75 * losses[0]


def test_critic_refuses_policy_methods(critic, tokenizer) -> None:
    batch = make_batch(tokenizer, 2)
    with pytest.raises(ValueError, match="critic"):
        critic.compute_logprobs(batch)
    # (export_hf writes a value model's backbone and head: tests/core/training/test_dpo.py)
