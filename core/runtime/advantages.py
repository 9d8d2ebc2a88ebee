"""From rewards to per-token advantages for one training batch, as the algorithm config says.

Runs on the driver over the whole batch (group statistics and batch whitening need every row);
the learner ranks then train on their shards of the result.

An episode may be several rows (an agent's calls, ``rollout.trajectory_mode=per_turn``; the
batch's ``episode`` field says which). Group estimators then compare episodes, each counted
once: an episode's score is its reward plus the per-row terms (overlong penalty, the KL paid in
the reward) of all its rows; GRPO and RLOO give each row its episode's advantage, and
REINFORCE++-baseline subtracts the group's mean episode score from each row's reward. Token
estimators (REINFORCE++, GAE) treat each row as a sequence that ends with the episode's reward.
"""

from __future__ import annotations

import torch

from core.algorithms import (
    AlgorithmConfig,
    gae_advantages,
    grpo_advantages,
    kl_penalized_rewards,
    overlong_penalty,
    place_at_last_token,
    reinforce_pp_advantages,
    rloo_advantages,
    shape_rewards,
)
from core.training.batch import TrainBatch


def shaped_rewards(batch: TrainBatch, algo: AlgorithmConfig, max_new_tokens: int) -> torch.Tensor:
    """``[N]`` rewards after bias/scale/clip and DAPO's overlong penalty."""
    rewards = shape_rewards(
        batch.rewards, bias=algo.reward_bias, scale=algo.reward_scale, clip=algo.reward_clip
    )
    if algo.overlong_reward_penalty:
        lengths = batch.loss_mask.sum(dim=1)
        max_len = algo.overlong_max_len or max_new_tokens
        rewards = rewards + overlong_penalty(
            lengths, max_len, algo.overlong_buffer_len, algo.overlong_penalty_factor
        )
    return rewards


def with_advantages(
    batch: TrainBatch,
    algo: AlgorithmConfig,
    *,
    max_new_tokens: int,
    values: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> TrainBatch:
    """``batch`` plus ``advantages`` ``[N, T]`` (and ``returns``/``old_values`` for a critic)."""
    rewards = shaped_rewards(batch, algo, max_new_tokens)
    mask = batch.loss_mask
    token_rewards: torch.Tensor | None = None
    if algo.kl_in_reward_coef > 0:
        if ref_logprobs is None:
            raise ValueError("algorithm.kl_in_reward_coef > 0 needs reference log-probs")
        token_rewards = kl_penalized_rewards(
            rewards,
            batch.behaviour_logprobs,
            ref_logprobs,
            mask,
            coef=algo.kl_in_reward_coef,
            kind=algo.kl_estimator,
        )
    estimator = algo.adv_estimator
    fields: dict[str, torch.Tensor] = {}
    if estimator == "gae":
        if values is None:
            raise ValueError("adv_estimator='gae' needs critic values (algorithm.use_critic=true)")
        per_token = (
            token_rewards if token_rewards is not None else place_at_last_token(rewards, mask)
        )
        advantages, returns = gae_advantages(
            per_token, values, mask, gamma=algo.gamma, lam=algo.lam
        )
        fields.update(returns=returns, old_values=values)
    elif estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        source = token_rewards if token_rewards is not None else rewards
        if estimator == "reinforce_pp_baseline":
            # REINFORCE++-baseline: each row's last-token reward minus its group's mean episode
            # score (with one row per episode, the mean of the group's Σ_t r_t).
            scores, episode = _episode_scores(batch, algo, rewards, token_rewards)
            group_mean = scores.reshape(-1, algo.group_size).mean(dim=-1)
            baseline = group_mean.repeat_interleave(algo.group_size)[episode]
            if source.dim() == 1:
                source = source - baseline
            else:
                source = source - place_at_last_token(baseline, mask)
        advantages = reinforce_pp_advantages(source, mask, gamma=algo.gamma)
    else:
        # Outcome estimators score a sequence: with KL in the reward that is the outcome minus
        # β·Σ_t KL_t, the sum of the sequence's token rewards (as verl's GRPO and RLOO do).
        scores, episode = _episode_scores(batch, algo, rewards, token_rewards)
        advantage = {
            "grpo": lambda r: grpo_advantages(r, algo.group_size, normalize_std=algo.normalize_std),
            "rloo": lambda r: rloo_advantages(r, algo.group_size),
        }[estimator](scores)
        advantages = advantage[episode][:, None] * mask
    return batch.with_fields(advantages=advantages * mask, **fields)


def _episode_scores(
    batch: TrainBatch,
    algo: AlgorithmConfig,
    rewards: torch.Tensor,
    token_rewards: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([E], [N])``: each episode's score and each row's episode (numbered from 0 in batch
    order). The score is the episode's shaped reward plus every row's own terms: the overlong
    penalty in ``rewards`` and, with KL in the reward, ``-β·Σ_t KL_t`` of ``token_rewards``. A
    row that generated nothing adds nothing (its ``token_rewards`` are all 0)."""
    mask = batch.loss_mask
    base = shape_rewards(
        batch.rewards, bias=algo.reward_bias, scale=algo.reward_scale, clip=algo.reward_clip
    )
    extra = rewards - base  # the overlong penalty, per row
    if token_rewards is not None:  # Σ_t of the row's token rewards is its reward minus its KL
        extra = token_rewards.sum(dim=1) - torch.where(mask.sum(1) > 0, base, 0.0)
    episode = batch.fields.get("episode")
    if episode is None:  # one row per episode
        episode = torch.arange(len(batch))
    episode = episode.long()
    first = torch.ones(len(batch), dtype=torch.bool)
    first[1:] = episode[1:] != episode[:-1]  # an episode's rows are consecutive
    return base[first].index_add(0, episode, extra), episode
