"""Text games from ``textarena`` as agent episodes, played through the OpenAI-shaped client.

``data.source=textarena`` makes one sample per seeded game of ``data.textarena.env_id`` (a
single-player game from textarena's registry); the agent :func:`play`
(``agent.function=core.workflows.textarena_game:play`` with the
:class:`~core.workflows.openai_agent.OpenAIAgentWorkflow`) plays it: the game's messages are the
user's turns, each reply is the player's move, and the game's own reward for the player is the
episode's reward. The game is textarena's ``-raw`` variant, without its observation wrappers:
the conversation already keeps the history a wrapper would re-send every turn. A sample::

    {"id": "ta-train-0", "question": <the game's opening message>,
     "answer": JSON {"env_id", "seed", "env_kwargs"} (what :func:`play` resets the game from),
     "sft_messages": a scripted player's winning game (where the game has one: SCRIPTED)}

textarena seeds Python's global ``random`` when a game resets and draws from it as it plays;
each game here keeps its own random state and swaps it in only around its own calls, so games
played side by side on one event loop neither disturb each other nor anything else.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.data.sources import DataSection, Splits, data_source
from core.schema import documented

if TYPE_CHECKING:
    from core.workflows.openai_agent import AgentEpisode  # transformers: not at config load


@dataclass
class TextArenaSpec:
    """Which textarena game, with which settings."""

    env_id: str = documented(
        "GuessTheNumber-v0",
        "A single-player game in textarena's registry (textarena.envs.registration."
        "ENV_REGISTRY), e.g. GuessTheNumber-v0, FrozenLake-v0, TowerOfHanoi-v0; its -raw "
        "variant is played.",
    )
    env_kwargs: dict[str, Any] = documented(
        help="The game's own settings, passed to it (GuessTheNumber: min_number, max_number, "
        "max_turns); empty = the registry's.",
        factory=dict,
    )


class Game:
    """One seeded game of a textarena environment, its global-random use kept to itself."""

    def __init__(self, env_id: str, seed: int, env_kwargs: dict[str, Any] | None = None) -> None:
        import textarena  # ~2 s import: only for this environment

        self.env_id = env_id
        self._rng_state = random.Random(seed).getstate()
        with self._own_random():
            self.env = textarena.make(_raw(env_id), **(env_kwargs or {}))
            self.env.reset(num_players=1, seed=seed)
        self.done = False
        self.opening = self.messages()  # the game's first message: the episode's question

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        outside = random.getstate()
        random.setstate(self._rng_state)
        try:
            yield
        finally:
            self._rng_state = random.getstate()
            random.setstate(outside)

    def messages(self) -> str:
        """What the game said since it was last asked (the opening, then each move's answer)."""
        with self._own_random():
            _, observation = self.env.get_observation()
        if isinstance(observation, str):
            return observation.strip()
        return "\n".join(str(text).strip() for sender, text, *_ in observation if sender != 0)

    def move(self, action: str) -> None:
        """Play ``action``; ``done`` says whether the game ended."""
        with self._own_random():
            self.done, _ = self.env.step(action)

    def result(self) -> tuple[float, str]:
        """(the player's reward, the game's reason); 0 for a game that did not end."""
        if not self.done:
            return 0.0, "the game did not end within the turns allowed"
        with self._own_random():
            rewards, info = self.env.close()
        return float(rewards[0]), str(info.get(0, {}).get("reason", ""))


def _raw(env_id: str) -> str:
    return env_id if env_id.endswith("-raw") else f"{env_id}-raw"


def spec_problems(spec: TextArenaSpec) -> list[str]:
    """What is wrong with ``spec`` ([] = nothing), each naming its field: an unknown game
    lists the available ones; a game that will not start for one player, or bad settings,
    say why."""
    from textarena.envs.registration import ENV_REGISTRY

    field = "data.textarena"
    if _raw(spec.env_id) not in ENV_REGISTRY:
        games = sorted(name[: -len("-raw")] for name in ENV_REGISTRY if name.endswith("-raw"))
        return [f"{field}.env_id={spec.env_id!r} is not in textarena's registry; games: {games}"]
    try:
        Game(spec.env_id, 0, spec.env_kwargs)
    except Exception as err:  # noqa: BLE001 - any failure to start is the config's problem
        return [f"{field}: {spec.env_id} with env_kwargs={spec.env_kwargs} does not start as a "
                f"single-player game: {type(err).__name__}: {err}"]  # fmt: skip
    return []


# ------------------------------------------------------------------ scripted players (SFT)
Player = Callable[[str, list[tuple[str, str]]], str]
"""A scripted player: (the game's opening, [(its move, the game's answer), ...]) -> next move."""


def guess_by_halving(opening: str, history: list[tuple[str, str]]) -> str:
    """GuessTheNumber: guess the middle of the numbers still possible (binary search)."""
    found = re.search(r"between (\d+) and (\d+)", opening)
    if found is None:
        raise ValueError(f"no range in the game's opening: {opening[:120]!r}")
    low, high = int(found.group(1)), int(found.group(2))
    for move, answer in history:
        guess = int(move.strip("[]"))
        low, high = (guess + 1, high) if "higher" in answer else (low, guess - 1)
    return f"[{(low + high) // 2}]"


SCRIPTED: dict[str, Player] = {"GuessTheNumber": guess_by_halving}
"""Games with a scripted player, by name (the env_id before ``-v``): their training samples
carry its winning conversations for SFT."""


def scripted_game(game: Game) -> list[dict[str, str]]:
    """The scripted player's conversation in a new ``game`` (after the opening), or [] where the
    game has no scripted player or it lost."""
    player = SCRIPTED.get(game.env_id.split("-v")[0])
    if player is None:
        return []
    opening, history, messages = game.opening, [], []
    while not game.done and len(history) < 64:
        move = player(opening, history)
        game.move(move)
        messages.append({"role": "assistant", "content": move})
        answer = "" if game.done else game.messages()
        history.append((move, answer))
        if answer:
            messages.append({"role": "user", "content": answer})
    return messages if game.result()[0] >= 1.0 else []


# ------------------------------------------------------------------ the data source
def _games(spec: TextArenaSpec, n: int, seed: int, split: str) -> list[dict[str, Any]]:
    samples = []
    for index in range(n):
        game_seed = random.Random(f"textarena-{seed}-{split}-{index}").randrange(2**31)
        game = Game(spec.env_id, game_seed, spec.env_kwargs)
        answer = {"env_id": spec.env_id, "seed": game_seed, "env_kwargs": spec.env_kwargs}
        sample = {"id": f"ta-{split}-{index}", "question": game.opening,
                  "answer": json.dumps(answer)}  # fmt: skip
        if split == "train":
            sample["sft_messages"] = scripted_game(game)
        samples.append(sample)
    return samples


@data_source("textarena", generated=True, check=lambda data: spec_problems(data.textarena))
def textarena_games(data: DataSection, seed: int) -> Splits:
    """Seeded games of ``data.textarena.env_id``: ``n_train`` to train on, ``n_test`` held out."""
    spec: TextArenaSpec = data.textarena  # type: ignore[attr-defined]
    return Splits(
        _games(spec, data.n_train, seed, "train"), _games(spec, data.n_test, seed, "test")
    )


# ------------------------------------------------------------------ the agent
async def play(episode: AgentEpisode) -> float:
    """Play the sample's game to its end or ``agent.max_turns`` moves; the game's reward."""
    settings = json.loads(episode.sample["answer"])
    game = Game(settings["env_id"], settings["seed"], settings.get("env_kwargs"))
    messages = list(episode.messages)
    moves = 0
    while not game.done and moves < episode.max_turns:
        reply = await episode.client.chat.completions.create(messages=messages)
        action = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": action})
        game.move(action)
        moves += 1
        if not game.done:
            messages.append({"role": "user", "content": game.messages()})
    reward, reason = game.result()
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    # the last move: what the eval's examples read
    episode.info.update(moves=moves, outcome=reason, completion=replies[-1] if replies else "")
    return reward
