"""verifiers environments: their rows as our samples, their rollout through our client, their
rubric as the reward (single- and multi-turn), bad specs, and an end-to-end run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.config import ConfigError, load_config
from core.data.sources import resolve_source
from core.workflows.openai_agent import AgentEpisode
from core.workflows.verifiers_env import play
from core.workflows.verifiers_example import CHECK, SYSTEM_PROMPT
from tests.core.workflows.helpers import two_step_run, two_trained_steps

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "verifiers.yaml"
SMALL_ENV = ["data.verifiers.env_args.n_train=40", "data.verifiers.env_args.n_test=10"]


def _splits(*overrides: str):
    cfg = load_config(RECIPE, [*SMALL_ENV, *overrides])
    return resolve_source("verifiers").fn(cfg.data, 0)


def test_the_environments_rows_become_samples_train_and_held_out() -> None:
    splits = _splits("data.n_train=30", "data.n_test=8")
    assert (len(splits.train), len(splits.test)) == (30, 8)  # n_train/n_test cap its datasets
    row = json.loads(splits.train[0]["answer"])
    assert row["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}  # as it formats them
    assert row["prompt"][-1]["content"] == splits.train[0]["question"]
    assert splits.train[0]["solution"] == row["answer"] and "####" in row["answer"]
    assert "solution" not in splits.test[0]  # held-out rows carry no SFT target
    assert not {s["question"] for s in splits.train} & {s["question"] for s in splits.test}


class _Model:
    """Stands in for the model behind ``episode.client``: gives the same reply to every call and
    keeps the conversations it was sent."""

    def __init__(self, reply: str) -> None:
        self.reply, self.sent = reply, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, messages: list[dict], model: str, **_: object):
        from openai.types.chat import ChatCompletion

        self.sent.append(list(messages))
        return ChatCompletion.model_validate({
            "id": "c", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": self.reply}}],
        })  # fmt: skip


def _episode(sample: dict, model: _Model) -> AgentEpisode:
    return AgentEpisode(client=model, sample=sample, messages=[], max_turns=4)  # type: ignore[arg-type]


@pytest.mark.parametrize("turns", [1, 2])
def test_the_environments_rollout_runs_through_the_client_and_its_rubric_scores_it(
    turns: int,
) -> None:
    sample = _splits(f"data.verifiers.env_args.turns={turns}").test[0]
    reference = json.loads(sample["answer"])["answer"]
    right = _Model(f"So it is #### {reference.split('####')[-1].strip()}")
    episode = _episode(sample, right)
    assert asyncio.run(play(episode)) == 1.0
    assert len(right.sent) == turns and episode.info == {
        "rubric": {"correct_answer": 1.0}, "turns": turns, "completion": right.reply
    }  # fmt: skip
    assert right.sent[0] == json.loads(sample["answer"])["prompt"]
    if turns == 2:
        assert right.sent[1][-1] == {"role": "user", "content": CHECK}
    assert asyncio.run(play(_episode(sample, _Model("#### 123456")))) == 0.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.verifiers.env=''", r"data.verifiers.env is empty: name a verifiers environment"),
        ("data.verifiers.env=no_such.env", r"data.verifiers.env='no_such.env' \(env_args=.*\) does not load: Could not import 'no_such.env'"),
        ("data.verifiers.env_args.turns=3", r"data.verifiers.env=.* does not load: .*turns=3: this environment plays 1 or 2 turns"),
    ],
)  # fmt: skip
def test_a_bad_environment_fails_when_the_config_loads_naming_the_field(
    override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, [*SMALL_ENV, override])


@pytest.mark.e2e
def test_a_multi_turn_verifiers_environment_trains_end_to_end(harness: str, tmp_path: Path) -> None:
    run_dir, summary = two_step_run(
        RECIPE, tmp_path, *SMALL_ENV, "data.verifiers.env_args.turns=2", "data.n_train=40"
    )
    rewards = two_trained_steps(run_dir, summary, n_test=4)
    assert all(r in (0.0, 1.0) for r in rewards)  # the rubric scores right or wrong
