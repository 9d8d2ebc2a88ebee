"""Single-process learner: micro-batch invariance, SFT, updates and versions, losses, bf16."""

from __future__ import annotations

import pytest
import torch

from core.algorithms import AlgorithmConfig
from core.models import load_model
from core.training import Learner, PolicyLoss, SFTLoss, StatsAccumulator, micro_batches
from tests.core.training.helpers import ADAM, SGD_LIKE, make_batch, max_abs_diff, ppo_batch, ppo_run

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def batch(model_dir, tokenizer):
    return ppo_batch(model_dir, tokenizer, 8)


def test_micro_batch_split_does_not_change_the_step(model_dir, batch) -> None:
    """Many micro-batches vs one: same loss, gradient norm and weights (PPO + KL + entropy)."""
    for learner_kw, weight_atol in ((SGD_LIKE, 1e-6), (ADAM, 5e-5)):
        one = ppo_run(model_dir, batch, learner_kw=learner_kw, micro_batch_tokens=10_000)
        many = ppo_run(model_dir, batch, learner_kw=learner_kw, micro_batch_tokens=40)
        assert [s["micro_batches"] for s in one["stats"]] == [1, 1]
        assert all(s["micro_batches"] >= 4 for s in many["stats"]), many["stats"][0][
            "micro_batches"
        ]
        for a, b in zip(one["stats"], many["stats"]):
            for key in ("loss", "policy_loss", "grad_norm", "kl", "entropy", "behav_weight_mean"):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
            assert a["ratio_max"] == pytest.approx(b["ratio_max"], rel=1e-6)
        assert one["stats"][1]["kl"] > 0  # the second step really moved away from the reference
        # SGD-like AdamW: tight. Default AdamW: Adam's per-element normalisation amplifies
        # rounding on near-zero gradients (see helpers.SGD_LIKE), so 5 % of lr=1e-3.
        assert max_abs_diff(one["state"], many["state"]) <= weight_atol


def test_sft_steps_reduce_the_loss(model_dir, tokenizer) -> None:
    batch = make_batch(tokenizer, 8, seed=5)
    learner = Learner(model_dir, **dict(ADAM, lr=1e-2), micro_batch_tokens=64)
    losses = [learner.sft_step(batch)["loss"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0]
    # The reported loss is the mean NLL over all loss tokens of the step (global token-mean).
    nll = -learner.compute_logprobs(batch)[batch.loss_mask != 0].mean()
    assert learner.sft_step(batch)["loss"] == pytest.approx(float(nll), rel=1e-5)


def test_stats_and_schedule_of_a_step(model_dir, tokenizer) -> None:
    batch = make_batch(tokenizer, 6, seed=6)
    learner = Learner(model_dir, **dict(ADAM, warmup_steps=2), micro_batch_tokens=50)
    first, second, third = (learner.sft_step(batch) for _ in range(3))
    assert (first["lr"], second["lr"], third["lr"]) == pytest.approx((5e-4, 1e-3, 1e-3))
    assert first["tokens"] == batch.n_tokens and first["loss_tokens"] == batch.n_loss_tokens
    assert first["micro_batches"] == len(micro_batches(batch, 50)) and first["seconds"] > 0
    assert first["nll"] == pytest.approx(first["loss"], rel=1e-5)  # token-mean NLL == loss
    assert (learner.step, learner.version) == (3, 0)


def test_update_runs_minibatches_and_bumps_the_version(model_dir, tokenizer) -> None:
    learner = Learner(model_dir, **ADAM, micro_batch_tokens=64)
    stats = learner.update(make_batch(tokenizer, 8), SFTLoss(), n_minibatches=4, group_size=2)
    assert len(stats) == 4 and all(s["loss_tokens"] > 0 for s in stats)
    assert (learner.step, learner.version) == (4, 1)


def test_reference_model_stays_frozen(model_dir, batch) -> None:
    learner = Learner(model_dir, **ADAM, micro_batch_tokens=64, reference_model_dir=model_dir)
    before = learner.compute_reference_logprobs(batch)
    torch.testing.assert_close(before, learner.compute_logprobs(batch), atol=0, rtol=0)
    learner.sft_step(batch)
    torch.testing.assert_close(learner.compute_reference_logprobs(batch), before, atol=0, rtol=0)
    assert not torch.equal(learner.compute_logprobs(batch), before)


def test_policy_loss_needs_its_inputs(model_dir, batch) -> None:
    learner = Learner(model_dir, **ADAM, micro_batch_tokens=64)
    with pytest.raises(ValueError, match="proximal_logprobs"):
        learner.train_step(batch, PolicyLoss(AlgorithmConfig()))
    with pytest.raises(KeyError, match="ref_logprobs"):
        prox = learner.compute_logprobs(batch)
        learner.train_step(
            batch.with_fields(proximal_logprobs=prox), PolicyLoss(AlgorithmConfig(kl_coef=0.1))
        )
    with pytest.raises(ValueError, match="loss_norm_constant"):
        PolicyLoss(AlgorithmConfig(loss_aggregation="seq-mean-token-sum-norm"))
    with pytest.raises(ValueError, match="with_value_head"):
        learner.compute_values(batch)


def test_loglinear_proximal_and_plain_ppo_run(model_dir, batch) -> None:
    learner = Learner(model_dir, **ADAM, micro_batch_tokens=64)
    loglinear = PolicyLoss(AlgorithmConfig(use_loglinear_proximal=True), proximal_version=0)
    assert learner.train_step(batch, loglinear)["loss_tokens"] == batch.n_loss_tokens
    plain = learner.train_step(batch, PolicyLoss(AlgorithmConfig(decoupled=False)))
    assert plain["behav_weight_mean"] == 1.0  # no behaviour correction in plain PPO


def test_proximal_from_the_training_pass_matches_a_separate_pass(model_dir, batch) -> None:
    # One optimiser step: π_prox from the step's own forward pass (no extra no-grad pass) gives
    # the same loss, statistics and weights as recomputing it first.
    # Several micro-batches (gradient accumulation) and an entropy bonus in the loss.
    algo = AlgorithmConfig(entropy_coef=0.01)
    explicit, implicit = (Learner(model_dir, **ADAM, micro_batch_tokens=64) for _ in range(2))
    prox = explicit.compute_logprobs(batch)
    a = explicit.train_step(batch.with_fields(proximal_logprobs=prox), PolicyLoss(algo))
    b = implicit.train_step(batch, PolicyLoss(algo, proximal_is_current=True))
    assert a["micro_batches"] > 1
    for key in ("loss", "policy_loss", "entropy", "grad_norm", "behav_weight_mean", "clip_frac"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    assert max_abs_diff(explicit.full_state_dict(), implicit.full_state_dict()) < 1e-6
    # A second step is no longer at π_prox = start-of-update weights: the results then differ,
    # and update() refuses the shortcut for several minibatch steps.
    a2 = explicit.train_step(batch.with_fields(proximal_logprobs=prox), PolicyLoss(algo))
    b2 = implicit.train_step(batch, PolicyLoss(algo, proximal_is_current=True))
    assert a2["policy_loss"] != pytest.approx(b2["policy_loss"], rel=1e-6)
    with pytest.raises(ValueError, match="one optimiser step"):
        implicit.update(batch, PolicyLoss(algo, proximal_is_current=True), n_minibatches=2)


def test_stats_accumulator_weights_and_extrema() -> None:
    acc = StatsAccumulator()
    acc.add({"clip_frac": 0.5, "ratio_max": 1.2, "ratio_min": 0.9, "policy_loss": 0.25}, weight=3)
    acc.add({"clip_frac": 0.1, "ratio_max": 1.1, "ratio_min": 0.7, "policy_loss": 0.5}, weight=1)
    acc.add({"clip_frac": 0.9, "ratio_max": 9.0, "ratio_min": 0.0, "policy_loss": 0.0}, weight=0)
    out = acc.reduce()
    assert out == pytest.approx(
        {"clip_frac": 0.4, "ratio_max": 1.2, "ratio_min": 0.7, "policy_loss": 0.75}
    )


def test_bfloat16_autocast_step(model_dir, batch) -> None:
    learner = Learner(model_dir, **ADAM, micro_batch_tokens=64, dtype="bfloat16")
    logprobs = learner.compute_logprobs(batch)
    assert logprobs.dtype == torch.float32
    exact = Learner(model_dir, **ADAM, micro_batch_tokens=64).compute_logprobs(batch)
    torch.testing.assert_close(logprobs, exact, atol=0.1, rtol=0)
    stats = learner.sft_step(batch)
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert next(learner.model.parameters()).dtype == torch.float32  # float32 master weights
    assert load_model(model_dir) is not None


def test_dropout_is_detected_so_the_learner_recomputes_proximal(model_dir) -> None:
    from core.runtime.learner_worker import _has_dropout

    model = load_model(model_dir)
    assert not _has_dropout(model)  # the presets have none: π_prox comes from the training pass
    model.config.attention_dropout = 0.1
    assert _has_dropout(model)
    assert _has_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))


def test_learner_honours_the_attention_implementation(model_dir, batch) -> None:
    kw = dict(ADAM, micro_batch_tokens=64, reference_model_dir=model_dir)
    eager = Learner(model_dir, **kw, attn_implementation="eager")
    assert eager.model.config._attn_implementation == "eager"
    assert eager.reference.config._attn_implementation == "eager"
    critic = Learner(model_dir, **ADAM, micro_batch_tokens=64, with_value_head=True,
                     attn_implementation="eager")  # fmt: skip
    assert critic.model.backbone.config._attn_implementation == "eager"
    sdpa = Learner(model_dir, **kw)  # the default
    assert sdpa.model.config._attn_implementation == "sdpa"
    # the kernels differ, the log-probs do not
    torch.testing.assert_close(
        eager.compute_logprobs(batch), sdpa.compute_logprobs(batch), atol=1e-5, rtol=0
    )


def test_loglinear_proximal_ratio_moves_in_later_minibatches(model_dir, tokenizer) -> None:
    """Issue 32 #1: on-policy tokens (generated at the learner's version) take π_prox = π_behav,
    so the second minibatch of an update sees the ratio the first one's step made (α = 1 there
    had pinned it at exactly 1, and clipping never fired after the first minibatch)."""
    batch = ppo_batch(model_dir, tokenizer, 8)
    with torch.no_grad():
        exact = Learner(model_dir, **ADAM, micro_batch_tokens=64).compute_logprobs(batch)
    batch.behaviour_logprobs = torch.where(batch.loss_mask != 0, exact, 0.0)
    batch.versions = torch.where(batch.loss_mask != 0, 0, -1)  # the learner's version 0
    learner = Learner(model_dir, **dict(ADAM, lr=5e-2), micro_batch_tokens=64)
    loss = PolicyLoss(AlgorithmConfig(use_loglinear_proximal=True), proximal_version=0)
    first, second = learner.update(batch, loss, n_minibatches=2)
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # θ = π_behav at the start
    assert abs(second["ratio_mean"] - 1.0) > 1e-3 and second["clip_frac"] > 0


@pytest.mark.parametrize(
    ("settings", "dropout", "recompute", "training_pass"),
    [
        ({}, False, True, False),  # 4 minibatches: π_prox must be computed before the first
        ({"ppo_n_minibatches": 1}, False, False, True),  # one step: the training pass is π_prox
        ({"ppo_n_minibatches": 1}, True, True, False),  # ... unless dropout makes it random
        ({"use_loglinear_proximal": True}, False, False, False),  # no pass: the approximation
        ({"decoupled": False}, False, False, False),  # plain PPO: π_old is the behaviour policy
    ],
)
def test_the_proximal_plan_is_decided_in_one_place(
    settings: dict, dropout: bool, recompute: bool, training_pass: bool
) -> None:
    from core.training.losses import proximal_plan

    plan = proximal_plan(AlgorithmConfig(**settings), has_dropout=dropout)
    assert (plan.recompute, plan.from_training_pass) == (recompute, training_pass)
    assert plan.exact_logprobs == (recompute or training_pass)
