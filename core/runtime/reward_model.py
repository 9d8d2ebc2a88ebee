"""The reward-model stage: the warm-started model's backbone with a scalar head, trained on the
preference pairs with the Bradley–Terry loss (InstructGPT, arXiv 2203.02155), on the learner
ranks (FSDP2). Its folder (``{run_dir}/reward_model``: the backbone as a causal LM's weights and
``value_head.safetensors``) loads back with ``ValueModel.from_pretrained``.

Held-out pairs are scored before (a fresh head: near chance) and after: ``accuracy`` is the share
of pairs whose chosen answer gets the higher reward (a tie counts half), ``margin`` the mean of
``r(chosen) − r(rejected)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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

STEP_KEYS = ("loss", "accuracy", "margin", "chosen_reward", "rejected_reward", "lr", "grad_norm")


def pairwise_metrics(rewards: torch.Tensor) -> dict[str, float]:
    """Held-out numbers from ``[pairs, 2]`` (chosen, rejected) rewards."""
    chosen, rejected = rewards[:, 0], rewards[:, 1]
    return {
        "accuracy": pairwise_wins(chosen, rejected),
        "margin": float((chosen - rejected).mean()),
        "chosen_reward": float(chosen.mean()),
        "rejected_reward": float(rejected.mean()),
    }


def _evaluate(learners: LearnerHandle, data: PairData, trained: bool) -> dict[str, float]:
    return pairwise_metrics(data.score_test(learners.sequence_rewards))


def reward_model_train(
    config: Config,
    model_dir: str,
    pairs: PreferencePairs,
    sink: MetricSink,
    on_step: Callable[[int], None] | None = None,
) -> PreferenceResult:
    """Run ``reward_model.steps`` optimizer steps; returns the reward model's folder and its
    held-out pairwise numbers before and after."""
    r = config.reward_model
    stage = PairStage("reward_model", r.steps, r.batch_size,
                      lambda learners: learners.reward_model_step, _evaluate, STEP_KEYS)  # fmt: skip
    result = train_on_pairs(config, model_dir, pairs, sink, on_step, stage)
    logger.info(
        "reward model: %d steps in %.1f s; held-out pairwise accuracy %.3f -> %.3f",
        r.steps, result.seconds, result.before["accuracy"], result.after["accuracy"],
    )  # fmt: skip
    return result
