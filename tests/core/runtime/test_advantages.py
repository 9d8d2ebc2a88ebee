"""From rewards to advantages on the driver: KL in the reward reaches every estimator."""

from __future__ import annotations

import pytest
import torch

from core.algorithms import algorithm_config, grpo_advantages, kl_penalty, rloo_advantages
from core.rollout.api import Trajectory
from core.runtime.advantages import with_advantages
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
    algo = algorithm_config(estimator, group_size=G, kl_in_reward_coef=0.5, kl_estimator="k1")
    got = with_advantages(batch, algo, max_new_tokens=8, ref_logprobs=ref)["advantages"]
    kl = kl_penalty(batch.behaviour_logprobs, ref, "k1") * batch.loss_mask
    scores = batch.rewards - 0.5 * kl.sum(dim=1)
    per_sequence = grpo_advantages(scores, G) if estimator == "grpo" else rloo_advantages(scores, G)
    torch.testing.assert_close(got, per_sequence[:, None] * batch.loss_mask)
