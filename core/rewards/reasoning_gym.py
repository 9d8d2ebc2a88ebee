"""reasoning-gym's own verifiers as the reward (``core.rewards.reasoning_gym:score``).

A sample's reference (core/data/reasoning_gym.py) holds the task's name and the package's entry;
the task's ``score_answer(answer, entry)`` scores the completion's answer in [0, 1] (some tasks
give partial credit). The answer is the text inside ``<answer>…</answer>`` when the completion
has those tags (the package's prompt format), else the whole completion, stripped.

Two rewards: :func:`score` is the task's score as it is; :func:`solved` counts full credit only.
Several tasks give partial credit to an answer that merely *contains* the right one (the
numeric tasks score ``len(oracle) / len(answer)`` when the oracle is a substring), and a policy
trained on that learns to emit long strings of digits: the recipe trains on ``solved``.

Both declare ``direct_share`` as an eval metric: how often the model answers without working
(the completion opens with ``<answer>``), the style core/data/reasoning_gym.py's
``direct_fraction`` mixes into the warm start.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from core.rewards.registry import with_completion_metrics


@functools.cache
def _scorer(task: str) -> Callable[..., float]:
    from reasoning_gym.factory import get_score_answer_fn

    return get_score_answer_fn(task)


def answer_text(completion: str) -> str:
    """The answer in a completion (see the module docstring)."""
    if "<answer>" in completion:
        from reasoning_gym.utils import extract_answer

        found = extract_answer(completion)
        if found is not None:
            return found.strip()
    return completion.strip()


def answers_directly(completion: str) -> bool:
    """Whether the completion gives its answer without working first."""
    return completion.lstrip().startswith("<answer>")


@with_completion_metrics(direct_share=answers_directly)
def score(completion: str, reference: str) -> float:
    """The task's own score of the completion's answer, in [0, 1]."""
    try:
        value: dict[str, Any] = json.loads(reference)
        task, entry = value["task"], value["entry"]
    except (TypeError, KeyError, json.JSONDecodeError) as err:
        raise ValueError(
            f"a reasoning-gym reference is JSON with task and entry; got {str(reference)[:80]!r}"
        ) from err
    return float(_scorer(task)(answer=answer_text(completion), entry=entry))


@with_completion_metrics(direct_share=answers_directly)
def solved(completion: str, reference: str) -> float:
    """1.0 when the task gives the completion's answer full credit, else 0.0."""
    return float(score(completion, reference) >= 1.0)
