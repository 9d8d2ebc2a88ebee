"""A trained reward model as an RL reward: concurrent calls share forward passes, a sequence
scores the same alone or padded in a batch, a failure reaches every waiting caller, and the
folder a reward-model stage writes loads back with its trained head."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
import torch

from core.config import ConfigError, load_config
from core.models import ValueModel
from core.models.value_model import save_value_head, split_state
from core.rewards.reward_model import RewardModelScorer
from core.training.checkpoint import export_hf

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def reward_model_dir(tool_chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A value model with a non-trivial head, written as the reward-model stage writes one."""
    model = ValueModel.from_pretrained(tool_chat_model, seed=3)
    with torch.no_grad():
        model.value_head.bias.fill_(0.25)
    backbone, head = split_state(model.state_dict())
    out = tmp_path_factory.mktemp("rm") / "reward_model"
    export_hf(backbone, tool_chat_model, out, dtype=torch.float32,
              extra=functools.partial(save_value_head, head))  # fmt: skip
    return out


def test_concurrent_calls_share_forward_passes(reward_model_dir: Path) -> None:
    scorer = RewardModelScorer(str(reward_model_dir), max_batch=4, max_wait_s=0.05)
    sequences = [[5 + i] * (3 + i) for i in range(10)]
    alone = [scorer.score_batch([s])[0] for s in sequences]

    async def score_all() -> list[float]:
        return await asyncio.gather(*(scorer(s) for s in sequences))

    batched = asyncio.run(score_all())
    assert batched == pytest.approx(alone, abs=1e-5)  # padding changes nothing
    assert len(set(round(x, 4) for x in alone)) > 5  # the scores differ by sequence
    assert scorer.stats() == {"calls": 10, "batches": 10 + 3}  # 10 alone, then 4 + 4 + 2


def test_the_trained_head_is_loaded(reward_model_dir: Path, tool_chat_model: Path) -> None:
    assert ValueModel.from_pretrained(reward_model_dir).value_head.bias.item() == 0.25
    assert ValueModel.from_pretrained(tool_chat_model).value_head.bias.item() == 0.0  # fresh


def test_a_failed_pass_reaches_every_waiting_caller(reward_model_dir: Path) -> None:
    scorer = RewardModelScorer(str(reward_model_dir), max_batch=8, max_wait_s=0.01)

    async def score_all() -> list:
        return await asyncio.gather(scorer([1, 2]), scorer([10**9]), return_exceptions=True)

    results = asyncio.run(score_all())
    assert all(isinstance(r, IndexError) for r in results), results  # an id beyond the vocab


def test_reward_model_in_rl_is_checked_when_the_config_loads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reward_model.use_in_rl needs a reward model"):
        load_config(None, ["reward_model.use_in_rl=true"])
    with pytest.raises(ConfigError, match=r"reward_model.path='/nowhere': no reward model folder"):
        load_config(None, ["reward_model.use_in_rl=true", "reward_model.path=/nowhere"])
    with pytest.raises(ConfigError, match="scores single-turn episodes"):
        load_config(None, ["reward_model.use_in_rl=true", "reward_model.enabled=true",
                           "rollout.workflow=core.workflows.tagged_tools:ToolAgentWorkflow"])  # fmt: skip
