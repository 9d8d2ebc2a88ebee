"""Advantage estimators by name: the built-ins, one of the user's by import path, and the
errors a wrong name or a wrong pairing gives before any work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from core.algorithms import algorithm_config
from core.algorithms.estimators import (
    ESTIMATORS,
    AdvantageInputs,
    Estimate,
    advantage_estimator,
    resolve_estimator,
)
from core.config import ConfigError, load_config
from core.rollout.api import Trajectory
from core.runtime.advantages import with_advantages
from core.training import collate

pytestmark = pytest.mark.unit
G = 4
ROOT = Path(__file__).resolve().parents[3]

# The module docstring's example, in a module of the user's own.
USER_MODULE = """
from core.algorithms.estimators import AdvantageInputs, Estimate, advantage_estimator


@advantage_estimator("my_baseline", groups=True)
def my_baseline(x: AdvantageInputs) -> Estimate:
    mean = x.scores.reshape(-1, x.algo.group_size).mean(-1, keepdim=True)
    per_episode = (x.scores.reshape(-1, x.algo.group_size) - mean).flatten()
    return Estimate(per_episode[x.episode][:, None] * x.loss_mask)


def not_an_estimator(x):
    return x
"""


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_estimators.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_estimators"
    sys.modules.pop("my_estimators", None)
    ESTIMATORS.pop("my_baseline", None)


def _batch():
    gen = torch.Generator().manual_seed(3)
    rows = [
        Trajectory(
            input_ids=[1, 2] + list(range(5, 8 + i % 3)),
            loss_mask=[0, 0] + [1] * (3 + i % 3),
            logprobs=[0.0, 0.0] + (-torch.rand(3 + i % 3, generator=gen)).tolist(),
            versions=[-1, -1] + [0] * (3 + i % 3),
            reward=float(torch.rand(1, generator=gen)),
            prompt_len=2,
        )
        for i in range(2 * G)
    ]
    return collate(rows, pad_id=0)


def test_the_built_ins_are_registered_with_what_they_need() -> None:
    needs = {name: (e.groups, e.critic) for name, e in ESTIMATORS.items()}
    assert needs == {
        "grpo": (True, False),
        "rloo": (True, False),
        "reinforce_pp": (False, False),
        "reinforce_pp_baseline": (True, False),
        "gae": (False, True),
    }


def test_a_users_estimator_by_import_path_runs_in_the_rl_step(user_module: str) -> None:
    """The docstring's mean baseline is Dr. GRPO's advantage (GRPO without the std)."""
    path = f"{user_module}:my_baseline"
    cfg = load_config(ROOT / "experiments/quickstart.yaml", [f"algorithm.adv_estimator={path}"])
    assert resolve_estimator(path) is ESTIMATORS["my_baseline"]
    batch = _batch()
    mine = with_advantages(batch, cfg.algorithm, max_new_tokens=8)["advantages"]
    dr_grpo = algorithm_config("grpo", group_size=G, normalize_std=False)
    ours = algorithm_config("grpo", group_size=G, adv_estimator=path)
    assert torch.allclose(with_advantages(batch, ours, max_new_tokens=8)["advantages"],
                          with_advantages(batch, dr_grpo, max_new_tokens=8)["advantages"])  # fmt: skip
    assert mine.shape == batch.loss_mask.shape and mine.abs().sum() > 0


def test_a_registered_name_works_once_its_module_is_imported(user_module: str) -> None:
    __import__(user_module)
    assert algorithm_config("grpo", group_size=G, adv_estimator="my_baseline").group_size == G
    with pytest.raises(ValueError, match="group_size must be >= 2 for adv_estimator='my_b"):
        algorithm_config("grpo", group_size=1, adv_estimator="my_baseline")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("grop", r"adv_estimator='grop' is not one of \['grpo', 'rloo'"),
        ("my_estimators:not_an_estimator", "is not decorated with @advantage_estimator"),
        ("my_estimators:nothing_here", "has no attribute 'nothing_here'"),
        ("no_such_module:fn", "cannot import module 'no_such_module'"),
    ],
)
def test_a_wrong_estimator_fails_at_load_naming_the_field(
    user_module: str, name: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "experiments/quickstart.yaml", [f"algorithm.adv_estimator={name}"])


def test_a_critic_estimator_needs_the_critic_and_only_it_uses_one() -> None:
    with pytest.raises(ValueError, match="use_critic=False does not fit .*'gae': it needs"):
        algorithm_config("grpo", adv_estimator="gae", group_size=1)
    with pytest.raises(ValueError, match="use_critic=True .*'grpo': only a critic"):
        algorithm_config("grpo", use_critic=True)


def test_a_taken_name_cannot_be_registered_twice() -> None:
    def other(x: AdvantageInputs) -> Estimate:
        return Estimate(x.loss_mask)

    with pytest.raises(ValueError, match="'grpo' is already core.algorithms.estimators:grpo"):
        advantage_estimator("grpo")(other)
    assert ESTIMATORS["grpo"].fn.__name__ == "grpo"
