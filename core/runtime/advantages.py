"""From rewards to per-token advantages for one training batch, as the algorithm config says.

Runs on the driver over the whole batch (group statistics and batch whitening need every row);
the learner ranks then train on their shards of the result.

An episode may be several rows (an agent's calls, ``agent.trajectory_mode=per_turn``; the
batch's ``episode`` field says which). Group estimators then compare episodes, each counted
once: an episode's score is its reward plus the per-row terms (overlong penalty, the KL paid in
the reward) of all its rows; GRPO and RLOO give each row its episode's advantage, and
REINFORCE++-baseline subtracts the group's mean episode score from each row's reward. Token
estimators (REINFORCE++, GAE) treat each row as a sequence that ends with the episode's reward.
"""

from __future__ import annotations

import torch

from core.algorithms import AlgorithmConfig, kl_penalized_rewards, overlong_penalty, shape_rewards
from core.algorithms.estimators import AdvantageInputs, resolve_estimator
from core.training.batch import TrainBatch


def overlong_penalties(
    batch: TrainBatch, algo: AlgorithmConfig, max_new_tokens: int
) -> torch.Tensor:
    """``[N]`` DAPO's soft overlong penalty per row (0 when off): the sum over the row's
    generation calls of the penalty of each call's length (the batch field ``budget_lengths``;
    without it the row is one call), so an agent's conversation of short calls is not punished
    for its total length."""
    if not algo.overlong_reward_penalty:
        return torch.zeros(len(batch))
    lengths = batch.fields.get("budget_lengths")
    if lengths is None:
        lengths = torch.zeros_like(batch.loss_mask)
        lengths[:, 0] = batch.loss_mask.sum(dim=1)
    max_len = algo.overlong_max_len or max_new_tokens
    penalty = overlong_penalty(
        lengths.flatten(), max_len, algo.overlong_buffer_len, algo.overlong_penalty_factor
    ).view_as(lengths)
    return torch.where(lengths > 0, penalty, 0.0).sum(dim=1)


def shaped_rewards(batch: TrainBatch, algo: AlgorithmConfig, max_new_tokens: int) -> torch.Tensor:
    """``[N]`` rewards plus DAPO's overlong penalty, then bias/scale/clip (AReaL's order: the
    penalty is part of the reward that gets shaped)."""
    return _shape(batch.rewards + overlong_penalties(batch, algo, max_new_tokens), algo)


def _shape(rewards: torch.Tensor, algo: AlgorithmConfig) -> torch.Tensor:
    return shape_rewards(
        rewards, bias=algo.reward_bias, scale=algo.reward_scale, clip=algo.reward_clip
    )


def with_advantages(
    batch: TrainBatch,
    algo: AlgorithmConfig,
    *,
    max_new_tokens: int,
    values: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> TrainBatch:
    """``batch`` plus ``advantages`` ``[N, T]`` (and ``returns``/``old_values`` for a critic),
    from the estimator ``algo.adv_estimator`` names (core/algorithms/estimators.py)."""
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
    # Outcome estimators score an episode: with KL in the reward that is the outcome minus
    # β·Σ_t KL_t, the sum of its token rewards (as verl's GRPO and RLOO do).
    scores, episode = _episode_scores(batch, algo, rewards, token_rewards, max_new_tokens)
    inputs = AdvantageInputs(
        rewards=rewards,
        scores=scores,
        episode=episode,
        loss_mask=mask,
        token_rewards=token_rewards,
        values=values,
        algo=algo,
    )
    estimate = resolve_estimator(algo.adv_estimator).fn(inputs)
    return batch.with_fields(advantages=estimate.advantages * mask, **estimate.fields)


def _episode_scores(
    batch: TrainBatch,
    algo: AlgorithmConfig,
    rewards: torch.Tensor,
    token_rewards: torch.Tensor | None,
    max_new_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([E], [N])``: each episode's score and each row's episode (numbered from 0 in batch
    order). The score is the shaped sum of the episode's reward and its rows' overlong penalties
    plus, with KL in the reward, ``-β·Σ_t KL_t`` of every row's ``token_rewards``. A row that
    generated nothing adds nothing (its ``token_rewards`` are all 0)."""
    mask = batch.loss_mask
    episode = batch.fields.get("episode")
    if episode is None:  # one row per episode
        episode = torch.arange(len(batch))
    episode = episode.long()
    first = torch.ones(len(batch), dtype=torch.bool)
    first[1:] = episode[1:] != episode[:-1]  # an episode's rows are consecutive
    penalty = overlong_penalties(batch, algo, max_new_tokens)
    scores = _shape(batch.rewards[first].index_add(0, episode, penalty), algo)
    if token_rewards is not None:  # Σ_t of a row's token rewards is its reward minus its KL
        kl = token_rewards.sum(dim=1) - torch.where(mask.sum(1) > 0, rewards, 0.0)
        scores = scores.index_add(0, episode, kl)
    return scores, episode
