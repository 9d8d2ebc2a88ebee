"""reasoning-gym's procedural tasks (``data.source=reasoning_gym``), deterministic per seed.

The ``reasoning-gym`` package generates problems of 100+ kinds (arithmetic, counting, word and
logic puzzles), each with its own verifier. ``data.reasoning_gym.tasks`` names the kinds,
``weights`` mixes them, and ``task_config`` passes each kind its own settings (its difficulty
knobs: ``{chain_sum: {min_terms: 2, max_terms: 2}}``); the package's composite dataset draws the
mix. Training and held-out problems come from two seeds derived from the data seed, with the
held-out questions removed from training. A problem becomes a sample::

    {"id": "rg-train-0", "question": <the task's question>,
     "answer": JSON {"task": <kind>, "entry": <the package's entry>} (what
     core.rewards.reasoning_gym scores with the kind's own verifier),
     "solution": the SFT target: ``<answer>N</answer>``, or for a task with a worked form
                 (:data:`WORKED`, ``worked_tasks``) in a ``1 - direct_fraction`` share of
                 training problems,
                 the working first: ``1 - 7 = -6, -6 - 8 = -14 <answer>-14</answer>``}

The worked share is the recipe's lever, as ``data.synthetic.direct_fraction`` is the math
quickstart's: a warm start that often answers directly, and then less accurately, leaves RL a
better way to find. The reward reads the answer between the tags (the package's own format), so
both forms score the same when right.

Names and settings are checked before any work (:func:`spec_problems`): an unknown kind lists the
available ones, a bad setting names its key.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core.data.tabular import remove_test_questions
from core.schema import documented

_OURS = ("seed", "size")  # set from the data section, the same for every task
_TEST_SEED_OFFSET = 1_000_003  # held-out problems: another stream of the package's generator


@dataclass
class ReasoningGymSpec:
    """Which reasoning-gym tasks, mixed how, with which settings."""

    tasks: list[str] = documented(
        help="reasoning-gym task names (reasoning_gym.factory.DATASETS), e.g. chain_sum, "
        "basic_arithmetic, leg_counting, letter_counting, spell_backward.",
        factory=lambda: ["chain_sum"],
    )
    weights: list[float] = documented(
        help="Sampling weight per task, in the order of tasks; empty = equal.", factory=list
    )
    task_config: dict[str, Any] = documented(
        help="Per task name, its reasoning-gym config keys (difficulty knobs), e.g. "
        "{chain_sum: {min_terms: 2, max_terms: 2}}; a task not in tasks keeps its settings unused.",
        factory=dict,
    )
    direct_fraction: float = documented(
        1.0,
        "Share of TRAINING solutions, of the tasks with a worked form (chain_sum, "
        "leg_counting), that give the answer alone; the rest show the working first. "
        "Held-out problems are scored on the answer only.",
        ge=0,
        le=1,
    )
    worked_tasks: list[str] = documented(
        help="The tasks whose training solutions may show the working (direct_fraction); the "
        "others always answer directly. Each must have a worked form: chain_sum, leg_counting.",
        factory=lambda: ["chain_sum", "leg_counting"],
    )


def _chain_working(entry: dict[str, Any]) -> str:
    """chain_sum: the running total, two terms at a time (``1 - 7 = -6, -6 - 8 = -14``)."""
    first, *rest = entry["metadata"]["expression"].split()
    total, steps = int(first), []
    for sign, term in zip(rest[::2], rest[1::2], strict=True):
        after = total + int(term) if sign == "+" else total - int(term)
        steps.append(f"{total} {sign} {term} = {after}")
        total = after
    return ", ".join(steps)


def _legs_working(entry: dict[str, Any]) -> str:
    """leg_counting: each animal's legs, then the sum (``2 chicken * 2 = 4, 4 + 14 = 18``)."""
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    counts = [(n, animal, ANIMALS[animal]) for animal, n in entry["metadata"]["animals"].items()]
    steps = [f"{n} {animal} * {legs} = {n * legs}" for n, animal, legs in counts]
    if len(counts) > 1:
        parts = [str(n * legs) for n, _, legs in counts]
        steps.append(f"{' + '.join(parts)} = {sum(n * legs for n, _, legs in counts)}")
    return ", ".join(steps)


WORKED: dict[str, Callable[[dict[str, Any]], str]] = {
    "chain_sum": _chain_working,
    "leg_counting": _legs_working,
}
"""The tasks whose training solutions can show the working, and how."""


def _registry() -> dict[str, tuple[type, type]]:
    from reasoning_gym.factory import DATASETS  # ~1 s import: only for this source

    return DATASETS


def spec_problems(spec: ReasoningGymSpec) -> list[str]:
    """What is wrong with ``spec`` ([] = nothing), each naming its field."""
    field = "data.reasoning_gym"
    known = _registry()
    tasks = list(spec.tasks)
    if not tasks:
        return [f"{field}.tasks is empty; name at least one of {sorted(known)}"]
    unknown = [name for name in tasks if name not in known]
    if unknown:
        return [f"{field}.tasks: unknown {unknown}; available: {sorted(known)}"]
    if len(set(tasks)) < len(tasks):
        return [f"{field}.tasks names a task twice: {tasks}"]
    weights = list(spec.weights)
    if weights and (len(weights) != len(tasks) or min(weights) < 0 or sum(weights) <= 0):
        return [
            f"{field}.weights={weights} needs one weight >= 0 per task "
            f"({len(tasks)}: {tasks}), not all 0; or [] for equal weights"
        ]
    unworked = [name for name in spec.worked_tasks if name not in WORKED]
    if unworked:
        return [f"{field}.worked_tasks: {unworked} have no worked form; those with one: "
                f"{sorted(WORKED)}"]  # fmt: skip
    # settings for a task outside the mix are kept, unused (a recipe's knobs survive a
    # command line that picks other tasks); a name no task has is a typo
    stray = [name for name in spec.task_config if name not in known]
    if stray:
        return [f"{field}.task_config names unknown task(s) {stray}; available: {sorted(known)}"]
    for name, settings in spec.task_config.items():
        key = f"{field}.task_config.{name}"
        config_cls = known[name][1]
        allowed = [f.name for f in dataclasses.fields(config_cls) if f.name not in _OURS]
        if not isinstance(settings, Mapping):
            return [f"{key}={settings!r} must map {name}'s config keys to values: {allowed}"]
        ours = [k for k in settings if k in _OURS]
        if ours:
            return [f"{key}: {ours} come from data.seed and data.n_train/n_test, not task_config"]
        stray = [k for k in settings if k not in allowed]
        if stray:
            return [f"{key}: unknown key(s) {stray}; {name} takes {allowed}"]
        try:
            config_cls(**dict(settings)).validate()
        except (TypeError, ValueError, AssertionError) as err:
            return [f"{key}: {err}"]
    return []


def _generate(spec: ReasoningGymSpec, size: int, seed: int, split: str) -> list[dict]:
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec

    weights = list(spec.weights) or [1.0] * len(spec.tasks)
    mix = [
        DatasetSpec(name, float(weight), dict(spec.task_config.get(name, {})))
        for name, weight in zip(spec.tasks, weights, strict=True)
        if weight > 0
    ]
    dataset = reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=mix)
    # its own stream: changing direct_fraction changes no question
    style_rng = random.Random(f"reasoning-gym-{seed}-{split}-style")
    samples = []
    for index, entry in enumerate(dataset):
        task = entry["metadata"]["source_dataset"]
        entry = json.loads(json.dumps(entry, default=str))  # plain JSON, as the cache stores it
        solution = f"<answer>{entry['answer']}</answer>"
        worked = style_rng.random() >= spec.direct_fraction
        shows_working = split == "train" and worked and task in spec.worked_tasks
        working = WORKED[task](entry) if shows_working else ""
        if working:  # a one-term sum has none
            solution = f"{working} {solution}"
        samples.append({
            "id": f"rg-{split}-{index}",
            "question": entry["question"],
            "answer": json.dumps({"task": task, "entry": entry}),
            "solution": solution,
            "task": task,
        })  # fmt: skip
    return samples


def reasoning_gym_splits(
    spec: ReasoningGymSpec, n_train: int, n_test: int, seed: int
) -> tuple[list[dict], list[dict], int]:
    """(train, test, training questions dropped because held out): ``n_train``/``n_test``
    problems from two seeds derived from ``seed``; the same seed, the same problems."""
    test = _generate(spec, n_test, seed + _TEST_SEED_OFFSET, "test")
    train, overlap = remove_test_questions(_generate(spec, n_train, seed, "train"), test)
    return train, test, overlap
