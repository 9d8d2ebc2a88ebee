"""RL algorithms as pure tensor functions: advantages, shaping, losses, aggregation, presets.

Conventions: padded ``[batch, tokens]`` tensors with a 0/1 ``loss_mask`` (1 on response tokens);
outcome rewards one scalar per sequence ``[batch]``; a group is ``group_size`` consecutive
sequences from the same prompt. See docs/algorithms.md.
"""

from core.algorithms.advantages import (
    broadcast_to_tokens,
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    place_at_last_token,
    reinforce_pp_advantages,
    rloo_advantages,
)
from core.algorithms.aggregation import AGGREGATION_MODES, aggregate_loss, global_normalizer
from core.algorithms.config import (
    PRESET_NOTES,
    PRESETS,
    AlgorithmConfig,
    algorithm_config,
    preset_names,
)
from core.algorithms.filtering import filter_uniform_groups
from core.algorithms.kl import KL_ESTIMATORS, kl_penalty
from core.algorithms.masking import masked_mean, masked_whiten
from core.algorithms.objectives import PolicyInputs, policy_objective
from core.algorithms.policy_loss import (
    behaviour_weights,
    cispo_policy_loss,
    loglinear_alpha,
    loglinear_proximal_logprobs,
    ppo_policy_loss,
)
from core.algorithms.preference import dpo_loss, reward_model_loss, sft_loss
from core.algorithms.shaping import kl_penalized_rewards, overlong_penalty, shape_rewards
from core.algorithms.value_loss import value_loss

__all__ = [
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "PRESETS",
    "PRESET_NOTES",
    "AlgorithmConfig",
    "PolicyInputs",
    "aggregate_loss",
    "algorithm_config",
    "behaviour_weights",
    "broadcast_to_tokens",
    "cispo_policy_loss",
    "discounted_returns",
    "dpo_loss",
    "filter_uniform_groups",
    "gae_advantages",
    "global_normalizer",
    "grpo_advantages",
    "kl_penalized_rewards",
    "kl_penalty",
    "loglinear_alpha",
    "loglinear_proximal_logprobs",
    "masked_mean",
    "masked_whiten",
    "overlong_penalty",
    "place_at_last_token",
    "policy_objective",
    "ppo_policy_loss",
    "preset_names",
    "reinforce_pp_advantages",
    "reward_model_loss",
    "rloo_advantages",
    "sft_loss",
    "shape_rewards",
    "value_loss",
]
