"""The DPO stage: the policy trained on preference pairs against a frozen copy of its starting
weights (Rafailov et al., arXiv 2305.18290), on the same learner ranks (FSDP2, LoRA) as RL.

Held-out pairs are scored before and after training:

* ``preference_accuracy``: the share of pairs whose chosen answer the policy finds more likely
  than the rejected one (sequence log-probabilities; a tie counts half) — what the policy
  prefers, comparable between any two models;
* ``reward_accuracy`` / ``reward_margin``: DPO's implicit reward ``β·(log π − log π_ref)``,
  chosen against rejected (at the start every margin is 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch

from core.config import Config
from core.data.preference import PreferencePairs
from core.runtime.handles import LearnerHandle
from core.runtime.metrics import MetricSink
from core.runtime.preference import (
    PairData,
    PairStage,
    PreferenceResult,
    pairwise_wins,
    train_on_pairs,
)

logger = logging.getLogger(__name__)

STEP_KEYS = ("loss", "reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward",
             "chosen_logp", "rejected_logp", "chosen_nll", "lr", "grad_norm")  # fmt: skip


def preference_metrics(
    policy: torch.Tensor, reference: torch.Tensor, beta: float
) -> dict[str, float]:
    """Held-out numbers from ``[pairs, 2]`` (chosen, rejected) log-probs (module docstring)."""
    chosen, rejected = policy[:, 0], policy[:, 1]
    margin = beta * ((chosen - reference[:, 0]) - (rejected - reference[:, 1]))
    return {
        "preference_accuracy": pairwise_wins(chosen, rejected),
        "reward_accuracy": float((margin > 0).float().mean()),
        "reward_margin": float(margin.mean()),
        "chosen_logp": float(chosen.mean()),
        "rejected_logp": float(rejected.mean()),
    }


def dpo_train(
    config: Config,
    model_dir: str,
    pairs: PreferencePairs,
    sink: MetricSink,
    on_step: Callable[[int], None] | None = None,
) -> PreferenceResult:
    """Run ``dpo.steps`` optimizer steps from ``model_dir``; returns the exported model (under
    ``{run_dir}/dpo``) and the held-out preference numbers before and after."""
    d = config.dpo
    reference: list[torch.Tensor] = []  # the frozen reference's held-out log-probs, once

    def evaluate(learners: LearnerHandle, data: PairData, trained: bool) -> dict[str, float]:
        if not reference:
            reference.append(data.score_test(partial(learners.sequence_logprobs, reference=True)))
        # Before the first step the policy is the reference: no second pass.
        policy = data.score_test(learners.sequence_logprobs) if trained else reference[0]
        return preference_metrics(policy, reference[0], d.beta)

    stage = PairStage("dpo", d.steps, d.batch_size, lambda learners: learners.dpo_step,
                      evaluate, STEP_KEYS)  # fmt: skip
    result = train_on_pairs(config, model_dir, pairs, sink, on_step, stage)
    logger.info(
        "DPO: %d steps in %.1f s; held-out preference accuracy %.3f -> %.3f",
        d.steps, result.seconds, result.before["preference_accuracy"],
        result.after["preference_accuracy"],
    )  # fmt: skip
    return result
