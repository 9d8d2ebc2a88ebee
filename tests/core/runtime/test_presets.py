"""Every algorithm preset end to end, and each one learning a task a tiny model can learn.

The task: from a random-initialised tiny model, write digits (``digit_share``: the share of
digit characters in the completion). A few dozen RL steps raise it far beyond noise for every
preset, which shows the whole loop — rollout, advantages, loss, update, publish — points uphill.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.algorithms import PRESETS
from core.config import load_config
from core.runtime.job import run_experiment

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
BASE = [
    "data.n_train=200",
    "data.n_test=8",
    "eval.n_problems=8",
    "eval.max_new_tokens=4",
    "eval.every_n_steps=0",
    "checkpoint.every_n_steps=0",
    "sft.enabled=false",
    "sampling.max_new_tokens=12",
    "algorithm.overlong_buffer_len=4",
    "rollout.reward_fn=tests.experiments.rewards:digit_share",
]
# KL on in three presets: GRPO's loss term, RLOO's and REINFORCE++'s KL in the reward.
KL = {"grpo": ["algorithm.kl_coef=0.01"], "rloo": [], "reinforce_pp": []}


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "reward/mean" in row]


@pytest.mark.e2e
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs_three_steps(tmp_path: Path, preset: str) -> None:
    overrides = [*BASE, f"cluster.fileroot={tmp_path}", "experiment.trial=p", f"algorithm={preset}"]
    overrides += ["rollout.batch_size=4", "algorithm.group_size=4", "learner.total_steps=3"]
    overrides += ["rollout.max_staleness=0"]  # each batch from the current policy
    config = load_config(QUICKSTART, [*overrides, *KL.get(preset, [])])
    summary = run_experiment(config)
    assert summary["steps"] == 3 and summary["version"] == 3 and summary["algorithm"] == preset
    steps = _steps(tmp_path / "quickstart" / "p")
    assert [row["step"] for row in steps] == [0, 1, 2]
    assert all(row["actor/grad_norm"] > 0 for row in steps)  # every update moved the policy
    if preset == "grpo":
        assert all(row["actor/kl"] >= 0 for row in steps) and steps[-1]["actor/kl"] > 0
    if preset in ("rloo", "reinforce_pp"):  # KL in the reward, against the initial policy
        assert config.algorithm.kl_in_reward_coef > 0
        kl = [row["reward/kl_in_reward"] for row in steps]
        assert abs(kl[0]) < 1e-6  # the first batch comes from the reference policy itself
        assert kl[-1] > 1e-4  # later ones from a policy that moved away from it
    if preset == "ppo":
        assert all("critic/loss" in row for row in steps)


# One preset per family of advantage estimator / objective; PPO's critic gets a larger step.
LEARNING = {
    "grpo": [],
    "rloo": [],
    "reinforce_pp": [],
    "ppo": ["algorithm.critic_lr=1e-3"],
    "gspo": [],
    "cispo": ["algorithm.ppo_n_minibatches=2"],  # a second minibatch: the ratio leaves 1
}


@pytest.mark.e2e
@pytest.mark.parametrize("preset", sorted(LEARNING))
def test_preset_learns_to_raise_its_reward(tmp_path: Path, preset: str) -> None:
    overrides = [*BASE, f"cluster.fileroot={tmp_path}", "experiment.trial=l", f"algorithm={preset}"]
    overrides += ["rollout.batch_size=8", "algorithm.group_size=4", "learner.total_steps=24"]
    overrides += ["rollout.max_staleness=1", "algorithm.lr=2e-3", *LEARNING[preset]]
    run_experiment(load_config(QUICKSTART, overrides))
    steps = _steps(tmp_path / "quickstart" / "l")
    rewards = [row["reward/mean"] for row in steps]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.1 and last > 2 * first, rewards
    if preset == "cispo":  # its clip acted: some ratios left [0, 1.28] in the second minibatch
        assert max(row["actor/clip_frac"] for row in steps) > 0
