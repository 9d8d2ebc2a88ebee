"""From rewards to advantages on the driver: KL in the reward reaches every estimator."""

from __future__ import annotations

import pytest
import torch

from core.algorithms import (
    algorithm_config,
    grpo_advantages,
    kl_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)
from core.rollout.api import Group, Trajectory
from core.runtime.advantages import shaped_rewards, with_advantages
from core.runtime.trainer import to_batch
from core.training import collate

pytestmark = pytest.mark.unit
G = 4


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    trajectories = []
    for i in range(2 * G):
        n = 3 + i % 3
        logprobs = (-torch.rand(n, generator=gen)).tolist()
        trajectories.append(
            Trajectory(
                input_ids=[1, 2] + list(range(5, 5 + n)),
                loss_mask=[0, 0] + [1] * n,
                logprobs=[0.0, 0.0] + logprobs,
                versions=[-1, -1] + [0] * n,
                reward=float(i % 2),
                prompt_len=2,
            )
        )
    batch = collate(trajectories, pad_id=0)
    ref = batch.behaviour_logprobs + 0.3 * torch.rand(batch.loss_mask.shape, generator=gen)
    return batch, ref * batch.loss_mask


@pytest.mark.parametrize("preset", ["grpo", "rloo", "dr_grpo", "reinforce_pp", "gspo"])
def test_kl_in_the_reward_changes_every_estimators_advantages(preset: str) -> None:
    batch, ref = _batch()
    plain = algorithm_config(preset, group_size=G, kl_in_reward_coef=0.0)
    with_kl = algorithm_config(preset, group_size=G, kl_in_reward_coef=0.5)
    a = with_advantages(batch, plain, max_new_tokens=8, ref_logprobs=ref)["advantages"]
    b = with_advantages(batch, with_kl, max_new_tokens=8, ref_logprobs=ref)["advantages"]
    assert (a - b).abs().max() > 1e-3  # it used to be dropped for grpo and rloo


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_outcome_estimators_score_outcome_minus_the_summed_kl(estimator: str) -> None:
    batch, ref = _batch(1)
    algo = algorithm_config(
        estimator, group_size=G, kl_in_reward_coef=0.5, kl_estimator="k1", kl_coef=0.0
    )
    got = with_advantages(batch, algo, max_new_tokens=8, ref_logprobs=ref)["advantages"]
    kl = kl_penalty(batch.behaviour_logprobs, ref, "k1") * batch.loss_mask
    scores = batch.rewards - 0.5 * kl.sum(dim=1)
    per_sequence = grpo_advantages(scores, G) if estimator == "grpo" else rloo_advantages(scores, G)
    torch.testing.assert_close(got, per_sequence[:, None] * batch.loss_mask)


def _episode(e: int, gen: torch.Generator) -> tuple[Trajectory, list[Trajectory]]:
    """Episode ``e`` of two calls as one conversation row and as two per-turn rows."""
    first, second = [20 + e] * (2 + e % 2), [30 + e] * 3
    ids = [1, 2, *first, 9, *second]
    mask = [0, 0] + [1] * len(first) + [0] + [1] * len(second)
    logprobs = [-float(torch.rand(1, generator=gen)) * m for m in mask]
    reward = float(e % 3 == 0)

    def row(n: int, trained: list[int]) -> Trajectory:
        return Trajectory(ids[:n], trained, logprobs[:n], [0 if m else -1 for m in trained],
                          reward, prompt_len=trained.index(1))  # fmt: skip

    call_1 = row(2 + len(first), mask[: 2 + len(first)])
    call_2 = row(len(ids), [0] * (3 + len(first)) + [1] * len(second))
    return row(len(ids), mask), [call_1, call_2]


def _reference(batch) -> torch.Tensor:
    """A reference model that differs from the behaviour policy by 0.1 × (position + 1)."""
    positions = torch.arange(batch.width, dtype=torch.float32).expand_as(batch.loss_mask)
    return (batch.behaviour_logprobs - 0.1 * (positions + 1)) * batch.loss_mask


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
@pytest.mark.parametrize("kl", [0.0, 0.5])
def test_an_episode_trained_per_turn_gets_its_conversations_advantage(
    estimator: str, kl: float
) -> None:
    """Each episode counted once: its turn rows all get the advantage its conversation row gets
    (the KL paid in the reward summed over the turns' tokens, as over the conversation's)."""
    gen = torch.Generator().manual_seed(3)
    episodes = [_episode(e, gen) for e in range(2 * G)]
    conversations = to_batch(
        [Group(f"p{g}", [c for c, _ in episodes[g * G : (g + 1) * G]], 0) for g in range(2)], 0
    )
    turns = to_batch(
        [Group.of_episodes(f"p{g}", [t for _, t in episodes[g * G : (g + 1) * G]], 0)
         for g in range(2)], 0,
    )  # fmt: skip
    assert turns["episode"].tolist() == [e for e in range(2 * G) for _ in range(2)]
    assert turns["group"].tolist() == [0] * 2 * G + [1] * 2 * G
    algo = algorithm_config(
        estimator, group_size=G, kl_in_reward_coef=kl, kl_estimator="k1", kl_coef=0.0
    )
    whole = with_advantages(
        conversations, algo, max_new_tokens=8, ref_logprobs=_reference(conversations)
    )
    split = with_advantages(turns, algo, max_new_tokens=8, ref_logprobs=_reference(turns))
    per_episode = whole["advantages"].sum(1) / whole.loss_mask.sum(1)
    assert per_episode.abs().max() > 0.1  # rewards differ within each group
    expected = per_episode[turns["episode"]][:, None] * turns.loss_mask
    torch.testing.assert_close(split["advantages"], expected)


def test_reinforce_pp_baseline_subtracts_the_groups_mean_episode_score() -> None:
    """One row per episode: REINFORCE++-baseline as the algorithm defines it. Several rows: each
    row's reward minus the mean of its group's episode rewards, each episode counted once."""
    batch, _ = _batch()
    algo = algorithm_config(
        "reinforce_pp", group_size=G, adv_estimator="reinforce_pp_baseline", kl_in_reward_coef=0.0
    )
    got = with_advantages(batch, algo, max_new_tokens=8)["advantages"]
    expected = reinforce_pp_advantages(
        batch.rewards, batch.loss_mask, baseline="group", group_size=G
    )
    torch.testing.assert_close(got, expected)

    gen = torch.Generator().manual_seed(0)
    episodes = [_episode(e, gen)[1] for e in range(G)]  # rewards 1, 0, 0, 1: mean 0.5
    episodes[0] = episodes[0] + [episodes[0][-1]]  # a third row: must not count twice
    turns = to_batch([Group.of_episodes("p", episodes, 0)], 0)
    got = with_advantages(turns, algo, max_new_tokens=8)["advantages"]
    centred = turns.rewards - 0.5
    torch.testing.assert_close(got, reinforce_pp_advantages(centred, turns.loss_mask))


def _agent_row(call_lengths: list[int], reward: float = 1.0) -> Trajectory:
    """A conversation row: each call's tokens generated, a 2-token tool turn between calls."""
    ids, mask = [1, 2], [0, 0]
    for n in call_lengths:
        ids += [7] * n + [3, 4]
        mask += [1] * n + [0, 0]
    return Trajectory(ids, mask, [-0.5 * m for m in mask], [0 if m else -1 for m in mask],
                      reward, prompt_len=2, call_lengths=list(call_lengths))  # fmt: skip


def test_the_overlong_penalty_counts_each_call_not_the_conversation() -> None:
    """Issue 32 #4: three 30-token calls under a 48-token per-call budget were punished in
    full (90 > 48); each call is inside the budget's free zone, so nothing is taken now. A
    call in the soft zone costs its share, the same for a conversation row and per-turn rows."""
    algo = algorithm_config(
        "dapo", group_size=2, overlong_buffer_len=16, dynamic_sampling=False
    )  # free up to 48 - 16 = 32 tokens a call
    short = to_batch([Group("p", [_agent_row([30, 30, 30]), _agent_row([30, 30, 30], 0.0)], 0)], 0)
    assert shaped_rewards(short, algo, 48).tolist() == [1.0, 0.0]
    soft = to_batch([Group("p", [_agent_row([30, 40]), _agent_row([10], 0.0)], 0)], 0)
    assert shaped_rewards(soft, algo, 48).tolist() == pytest.approx([1.0 - 8 / 16, 0.0])
    # the same episode as two per-turn rows: the episode pays the same penalty
    calls = [_agent_row([30]), _agent_row([40])]
    turns = to_batch([Group.of_episodes("p", [calls, [_agent_row([10], 0.0)]], 0)], 0)
    whole = with_advantages(soft, algo, max_new_tokens=48)["advantages"]
    split = with_advantages(turns, algo, max_new_tokens=48)["advantages"]
    assert whole[0].max() == pytest.approx(split[0].max()) and whole[0].max() > 0


def test_the_overlong_penalty_is_shaped_with_the_reward() -> None:
    """Issue 32 #7 (AReaL's order): clip(reward + penalty), not clip(reward) + penalty."""
    algo = algorithm_config(
        "dapo", group_size=2, overlong_buffer_len=4, reward_clip=0.5, dynamic_sampling=False
    )
    batch = to_batch([Group("p", [_agent_row([9], 1.0), _agent_row([9], 0.0)], 0)], 0)
    # 9 tokens > 8: penalty -1. reward 1 → clip(0) = 0 (was 0.5 - 1); reward 0 → clip(-1) = -0.5
    assert shaped_rewards(batch, algo, 8).tolist() == [0.0, -0.5]
