"""DPO and the reward model in the learner: each loss of ``train_step`` against an independent
computation from plain forward passes, pairs kept whole across micro-batches, steps that widen
the margin, and a reward model's export loading back."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core.models import ValueModel, last_token_values, load_model
from core.training import (
    DPOLoss,
    Learner,
    RewardModelLoss,
    TrainBatch,
    micro_batch_indices,
    token_logprobs,
)
from tests.core.training.helpers import SGD_LIKE, make_batch

pytestmark = pytest.mark.unit

BETA = 0.5


@pytest.fixture(scope="module")
def reference_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference that differs from the policy (at the start of DPO they are equal and every
    loss is log 2, which would hide a wrong sign or pairing)."""
    out = tmp_path_factory.mktemp("reference")
    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    model = load_model(model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out)
    return out


def _sums(model_dir: Path, batch: TrainBatch) -> torch.Tensor:
    with torch.no_grad():
        lp = token_logprobs(load_model(model_dir), batch.input_ids, batch.attention_mask)
    return (lp * batch.loss_mask).sum(-1)


def _learner(model_dir: Path, reference_dir: Path, micro_batch_tokens: int) -> Learner:
    return Learner(model_dir, **SGD_LIKE, micro_batch_tokens=micro_batch_tokens,
                   reference_model_dir=reference_dir)  # fmt: skip


def _step(learner: Learner, batch: TrainBatch) -> dict[str, float]:
    batch = batch.with_fields(ref_logprobs=learner.compute_reference_logprobs(batch))
    return learner.train_step(batch, DPOLoss(beta=BETA))


def test_micro_batches_keep_pairs_whole(tokenizer) -> None:
    batch = make_batch(tokenizer, 12, seed=2)
    packs = micro_batch_indices(batch, 60, group_size=2)
    assert len(packs) > 2
    rows = sorted(int(r) for pack in packs for r in pack)
    assert rows == list(range(12))
    for pack in packs:
        assert [int(r) // 2 for r in pack[0::2]] == [int(r) // 2 for r in pack[1::2]]
        assert all(int(r) % 2 == 0 for r in pack[0::2])
    with pytest.raises(ValueError, match="11 rows do not form groups of 2"):
        micro_batch_indices(batch.select(slice(0, 11)), 60, group_size=2)


def test_dpo_step_matches_an_independent_computation(model_dir, reference_dir, tokenizer) -> None:
    batch = make_batch(tokenizer, 12, seed=3)  # rows 2i (chosen) and 2i+1 (rejected)
    policy, reference = _sums(model_dir, batch), _sums(reference_dir, batch)
    h = (policy[0::2] - reference[0::2]) - (policy[1::2] - reference[1::2])
    expected = -F.logsigmoid(BETA * h).mean()
    one = _step(_learner(model_dir, reference_dir, 10_000), batch)
    many_learner = _learner(model_dir, reference_dir, 60)
    many = _step(many_learner, batch)
    assert one["micro_batches"] == 1 and many["micro_batches"] > 2
    for stats in (one, many):
        assert stats["loss"] == pytest.approx(float(expected), rel=1e-5)
        assert stats["reward_accuracy"] == pytest.approx(float((h > 0).float().mean()))
        assert stats["reward_margin"] == pytest.approx(float(BETA * h.mean()), rel=1e-5)
        assert stats["chosen_logp"] == pytest.approx(float(policy[0::2].mean()), rel=1e-5)
    assert one["grad_norm"] == pytest.approx(many["grad_norm"], rel=1e-5)
    # RPO: + the chosen answers' per-token NLL, averaged over pairs.
    nll = -policy[0::2] / batch.loss_mask[0::2].sum(-1)
    learner = _learner(model_dir, reference_dir, 60)
    ref = learner.compute_reference_logprobs(batch)
    rpo = learner.train_step(batch.with_fields(ref_logprobs=ref), DPOLoss(beta=BETA, nll_coef=0.5))
    assert rpo["loss"] == pytest.approx(float(expected + 0.5 * nll.mean()), rel=1e-5)
    assert rpo["chosen_nll"] == pytest.approx(float(nll.mean()), rel=1e-5)
    # More steps widen the implicit reward margin on the same pairs.
    later = [_step(many_learner, batch) for _ in range(5)][-1]
    assert later["reward_margin"] > many["reward_margin"] + 0.1
    assert later["loss"] < many["loss"]


def test_reward_model_step_matches_bradley_terry_and_exports(
    model_dir, tokenizer, tmp_path
) -> None:
    """A value model's Bradley–Terry step against the loss from a plain forward pass (reward =
    the value at the last token), the same over micro-batches, and its export loading back."""
    batch = make_batch(tokenizer, 12, seed=4)
    learners = [
        Learner(model_dir, **SGD_LIKE, micro_batch_tokens=t, with_value_head=True)
        for t in (10_000, 60)
    ]
    with torch.no_grad():
        values = ValueModel.from_pretrained(model_dir)(batch.input_ids, batch.attention_mask)
    rewards = last_token_values(values, batch.attention_mask)
    diff = rewards[0::2] - rewards[1::2]
    one, many = (learner.train_step(batch, RewardModelLoss()) for learner in learners)
    assert one["micro_batches"] == 1 and many["micro_batches"] > 2
    for stats in (one, many):
        assert stats["loss"] == pytest.approx(float(-F.logsigmoid(diff).mean()), rel=1e-5)
        assert stats["accuracy"] == pytest.approx(float((diff > 0).float().mean()))
        assert stats["margin"] == pytest.approx(float(diff.mean()), rel=1e-4, abs=1e-7)
    later = [learners[1].train_step(batch, RewardModelLoss()) for _ in range(10)][-1]
    assert later["loss"] < one["loss"] and later["margin"] > one["margin"]
    out = learners[1].export_hf(tmp_path / "rm")
    assert (out / "value_head.safetensors").exists()
    with torch.no_grad():
        trained = learners[1].compute_values(batch)
        reloaded = ValueModel.from_pretrained(out)(batch.input_ids, batch.attention_mask)
    assert torch.allclose(trained, reloaded, atol=1e-5)
