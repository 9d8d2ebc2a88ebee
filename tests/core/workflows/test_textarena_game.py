"""textarena's games as agent episodes: seeded games, a scripted player's winning SFT games,
the game's reward through the OpenAI-shaped client, bad specs, and an end-to-end run."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.config import ConfigError, load_config
from core.data.sources import resolve_source
from core.workflows.openai_agent import AgentEpisode
from core.workflows.textarena_game import Game, guess_by_halving, play, scripted_game
from tests.core.workflows.helpers import two_step_run, two_trained_steps

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "textarena.yaml"
SETTINGS = {"min_number": 1, "max_number": 20, "max_turns": 10}


def _splits(seed: int, n_train: int = 20, n_test: int = 5):
    cfg = load_config(RECIPE, [f"data.n_train={n_train}", f"data.n_test={n_test}"])
    return resolve_source("textarena").fn(cfg.data, seed)


def test_games_are_seeded_and_the_same_seed_makes_the_same_games() -> None:
    first, again, other = _splits(1), _splits(1), _splits(2)
    assert first.train == again.train and first.test == again.test
    seeds = [json.loads(s["answer"])["seed"] for s in first.train + first.test]
    assert len(set(seeds)) == len(seeds)
    assert seeds != [json.loads(s["answer"])["seed"] for s in other.train + other.test]
    assert "Guess The Number" in first.test[0]["question"]
    assert "sft_messages" not in first.test[0]  # held-out games carry no solution


def test_the_scripted_player_wins_every_training_game_by_halving() -> None:
    for sample in _splits(3, n_train=30).train:
        messages = sample["sft_messages"]
        assert messages and messages[-1]["role"] == "assistant"
        assert len([m for m in messages if m["role"] == "assistant"]) <= 5  # log2(20) rounds up
        game = json.loads(sample["answer"])
        replay = Game(game["env_id"], game["seed"], game["env_kwargs"])
        for move in (m["content"] for m in messages if m["role"] == "assistant"):
            replay.move(move)
        assert replay.result()[0] == 1.0  # the game itself says the last guess won
    opening = "guess the number between 1 and 20 within 10 turns"
    assert guess_by_halving(opening, []) == "[10]"
    assert guess_by_halving(opening, [("[10]", "higher"), ("[15]", "lower")]) == "[12]"


def test_a_game_keeps_its_randomness_to_itself() -> None:
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    first = Game("GuessTheNumber-v0", 7, SETTINGS)  # textarena seeds the global random
    drawn = [random.random() for _ in range(3)]
    assert drawn == expected
    second = Game("GuessTheNumber-v0", 7, SETTINGS)
    assert first.env.state.game_state["game_number"] == second.env.state.game_state["game_number"]
    assert not scripted_game(Game("FrozenLake-v0", 1, {}))  # no scripted player: no SFT game


def test_a_game_that_does_not_end_scores_zero_and_says_why() -> None:
    game = Game("GuessTheNumber-v0", 5, SETTINGS)
    game.move("[1]" if game.env.state.game_state["game_number"] != 1 else "[2]")
    assert not game.done
    assert game.result() == (0.0, "the game did not end within the turns allowed")
    assert "The target number is higher." in game.messages()


class _HalvingModel:
    """Stands in for the model behind ``episode.client``: answers each call by halving, and
    keeps the conversations it was sent."""

    def __init__(self) -> None:
        self.sent: list[list[dict]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, messages: list[dict], **_: object) -> SimpleNamespace:
        self.sent.append(list(messages))
        history = [(m["content"], a["content"]) for m, a in zip(messages[1::2], messages[2::2])]
        move = guess_by_halving(messages[0]["content"], history)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=move))])


def test_the_agent_sees_the_conversation_sft_trained_on_and_gets_the_games_reward() -> None:
    sample = _splits(4, n_train=1).train[0]
    model = _HalvingModel()
    opening = [{"role": "user", "content": sample["question"]}]
    episode = AgentEpisode(client=model, sample=sample, messages=opening, max_turns=10)  # type: ignore[arg-type]
    assert asyncio.run(play(episode)) == 1.0
    # the turns before its last move are the SFT game's, the opening said once
    assert model.sent[-1][1:] == sample["sft_messages"][:-1]
    assert episode.info == {
        "moves": len(model.sent),
        "outcome": "Congratulations! You guessed the correct number.",
        "completion": sample["sft_messages"][-1]["content"],  # the winning guess
    }
    short = AgentEpisode(client=_HalvingModel(), sample=sample, messages=opening, max_turns=1)  # type: ignore[arg-type]
    assert asyncio.run(play(short)) == (1.0 if len(model.sent) == 1 else 0.0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.textarena.env_id=GuessTheNumbr-v0", r"env_id='GuessTheNumbr-v0' is not in textarena's registry; games: \[.*'GuessTheNumber-v0'"),
        ("data.textarena.env_kwargs.max_numbr=5", r"data.textarena: GuessTheNumber-v0 with env_kwargs=.* does not start as a single-player game: TypeError"),
    ],
)  # fmt: skip
def test_a_bad_game_fails_when_the_config_loads_naming_the_field(
    override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, [override])


@pytest.mark.e2e
def test_an_agent_plays_the_game_end_to_end_and_the_game_scores_it(
    harness: str, tmp_path: Path
) -> None:
    run_dir, summary = two_step_run(RECIPE, tmp_path)
    two_trained_steps(run_dir, summary, n_test=4)
