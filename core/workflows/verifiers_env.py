"""Environments written for ``verifiers`` (PrimeIntellect's package), trained as they are.

``data.source=verifiers`` loads ``data.verifiers.env`` the way verifiers itself does
(``verifiers.load_environment``: an installed environment's module, or any importable module with
a ``load_environment(**env_args)`` function) and takes its problems: training rows from the
environment's ``dataset``, held-out rows from its ``eval_dataset`` (or, without one, the last
``n_test`` rows). The agent :func:`play` (``agent.function=core.workflows.verifiers_env:play``
with the :class:`~core.workflows.openai_agent.OpenAIAgentWorkflow`) runs the environment's own
``rollout`` — single- or multi-turn, its parser, its tools — with our OpenAI-shaped client as
its client, so every call's tokens, log-probs and versions are recorded as for our own agents,
and the environment's rubric scores the result: its weighted reward is the episode's. A sample::

    {"id": "vf-train-0", "question": <the prompt's last user message>,
     "answer": JSON {"env", "env_args", "prompt", "answer", "task", "info"} (the row as the
                environment formatted it: what :func:`play` hands back to it),
     "solution": the row's answer, the SFT target (training rows; ``sft.enabled=false`` where an
                 environment's answers are not solutions)}
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.data.sources import DataSection, Splits, data_source
from core.schema import documented

if TYPE_CHECKING:
    from core.workflows.openai_agent import AgentEpisode  # transformers: not at config load

MODEL_NAME = "policy"  # the model name the environment's calls carry; the client ignores it


@dataclass
class VerifiersSpec:
    """Which verifiers environment, with which arguments."""

    env: str = documented(
        "",
        "A verifiers environment id, as verifiers.load_environment takes it: the module of an "
        "installed environment ('vf-gsm8k' -> vf_gsm8k), or any importable module "
        "('my_pkg.my_env') with a load_environment(**env_args) function.",
    )
    env_args: dict[str, Any] = documented(
        help="Keyword arguments for the environment's load_environment.", factory=dict
    )


@functools.cache
def _load(env: str, env_args_json: str) -> Any:
    """The environment, loaded once per process (its datasets and rubric are built once)."""
    import verifiers

    return verifiers.load_environment(env, **json.loads(env_args_json))


def load(spec: VerifiersSpec) -> Any:
    """``spec``'s environment (``verifiers.Environment``)."""
    return _load(spec.env, json.dumps(spec.env_args, sort_keys=True))


def spec_problems(spec: VerifiersSpec) -> list[str]:
    """What is wrong with ``spec`` ([] = nothing), each naming its field."""
    field = "data.verifiers.env"
    if not spec.env:
        return [f"{field} is empty: name a verifiers environment (an installed one, or a module "
                "with load_environment), e.g. data.verifiers.env=my_pkg.my_env"]  # fmt: skip
    try:
        environment = load(spec)
    except Exception as err:  # noqa: BLE001 - verifiers wraps any failure to load
        return [f"{field}={spec.env!r} (env_args={spec.env_args}) does not load: {err}"]
    if getattr(environment, "message_type", "chat") != "chat":
        return [f"{field}={spec.env!r} is a completion environment; only chat ones are run"]
    return []


def _rows(dataset: Any, n: int, env: str, env_args: dict[str, Any], split: str) -> list[dict]:
    samples = []
    for index, row in enumerate(dataset.select(range(min(n, len(dataset))))):
        prompt = row["prompt"]
        users = [m["content"] for m in prompt if m["role"] == "user"]
        answer = {
            "env": env, "env_args": env_args, "prompt": prompt, "answer": row.get("answer", ""),
            "task": row.get("task") or "default", "info": row.get("info") or {},
        }  # fmt: skip
        sample = {"id": f"vf-{split}-{index}", "question": users[-1] if users else "",
                  "answer": json.dumps(answer, default=str)}  # fmt: skip
        if split == "train" and isinstance(answer["answer"], str) and answer["answer"]:
            sample["solution"] = answer["answer"]  # the SFT target
        samples.append(sample)
    return samples


@data_source("verifiers", check=lambda data: spec_problems(data.verifiers))
def verifiers_rows(data: DataSection, seed: int) -> Splits:
    """The environment's own rows: ``dataset`` to train on, ``eval_dataset`` held out (or the
    last ``n_test`` rows of ``dataset`` when it has none); ``n_train``/``n_test`` cap them."""
    spec: VerifiersSpec = data.verifiers  # type: ignore[attr-defined]
    environment = load(spec)
    train, test = environment.dataset, environment.eval_dataset
    if test is None:
        if train is None or len(train) <= data.n_test:
            raise ValueError(
                f"data.verifiers.env={spec.env!r} has no eval_dataset, and its dataset has "
                f"{0 if train is None else len(train)} rows: too few to hold out "
                f"data.n_test={data.n_test}"
            )
        train, test = (
            train.select(range(len(train) - data.n_test)),
            train.select(range(len(train) - data.n_test, len(train))),
        )
    return Splits(
        [] if train is None else _rows(train, data.n_train, spec.env, spec.env_args, "train"),
        _rows(test, data.n_test, spec.env, spec.env_args, "test"),
    )


async def play(episode: AgentEpisode) -> float:
    """The environment's rollout on the sample, through ``episode.client``; its rubric's
    weighted reward (each reward function's score goes to the episode's info)."""
    row = json.loads(episode.sample["answer"])
    environment = _load(row["env"], json.dumps(row["env_args"], sort_keys=True))
    completion, state = await environment.rollout(
        episode.client, MODEL_NAME, row["prompt"], row["answer"], row["task"], row["info"],
        sampling_args={},
    )  # fmt: skip
    score = await environment.rubric.score_rollout(
        row["prompt"], completion, row["answer"], state, row["task"], row["info"]
    )
    replies = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
    # the last reply: what the eval's examples and completion metrics read
    episode.info.update(rubric=dict(score.metrics), turns=state.get("turn", 0),
                        completion=replies[-1] if replies else "")  # fmt: skip
    return float(score.reward)
