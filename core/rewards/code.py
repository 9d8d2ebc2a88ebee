"""Code reward: run the code in a completion against a problem's tests, in the sandbox.

**Task format.** A code problem is a prompt and tests. The reference the reward gets (a sample's
``answer``) is JSON: a list of test statements, ``["assert f(1) == 4", "assert f(2) == 5"]``, or
an object ``{"tests": [...]}``. A test is Python run after the solution, in the solution's
namespace; it passes when it runs without raising. A JSONL file with ``prompt``/``tests`` columns
works through ``data.source=dataset`` (``data.answer_key=tests``; a list column is kept as JSON).

**The code in a completion** (:func:`extract_code`): the body of its first fenced block
(```` ```python ... ``` ````, the closing fence optional), or else the whole completion; dedented.

**Scoring.** Code that does not compile scores 0 without a sandbox run (the held-out eval reports
the share of completions that compile, :func:`compiles`). Otherwise one process
from :func:`core.sandbox.run_python` (jailed; memory, CPU and wall-time limits; no
network, no writes outside its tmpfs) runs the solution, then each test, and writes a line
tagged with a per-call random nonce for each test that passed; the solution's own ``print``
goes to ``/dev/null``. :func:`tests_passed_fraction` is passed / tests; :func:`all_tests_pass`
is 1.0 only when every test passed. Identical code against identical tests runs once per
process (:data:`CACHE_SIZE` entries): the samples of a GRPO group often repeat.

**Failures.** What the model's code does wrong — a syntax error, an exception, an infinite loop
(killed at the wall-time limit), a memory or CPU limit, a socket or a write outside its workdir —
scores 0 for every test it did not pass, and is counted by outcome (:func:`stats`). What the
verifier cannot do — the sandbox refusing to run code (``tools.sandbox=strict`` on a machine
without the jail's kernel features), a sandbox that failed to start, a malformed reference —
raises, so the scorer scores 0 and counts a reward failure.

**Settings and the event loop.** The sandbox policy and its wall-time limit come from the config
(``tools.sandbox``, ``tools.timeout_s``) as the keyword arguments ``sandbox`` and
``sandbox_timeout_s`` (:func:`core.rewards.registry.bind_settings`). Both rewards are marked
:func:`~core.rewards.registry.blocking`: called inline, they run in a worker thread, and with
``rollout.reward_workers`` in a verifier process, never on the rollout's event loop.

Not a defence against a policy that sets out to forge the harness's result lines: the tests run
in the solution's interpreter, so code that inspects the harness's frames could find the nonce.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import math
import re
import secrets
import textwrap
import threading
from collections import Counter
from typing import Any

from core.rewards.registry import blocking, with_completion_metrics
from core.sandbox import SandboxLimits, ToolResult, run_python

log = logging.getLogger(__name__)

OUTCOMES = ("passed", "failed", "error", "timeout", "syntax_error", "no_code")
DEFAULT_TIMEOUT_S = 5.0
CACHE_SIZE = 4096
_VERIFIER_ERRORS = ("sandbox refused", "sandbox setup failed")
FENCE = re.compile(r"```[ \t]*[\w+.-]*[ \t]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE)

# Runs in the sandbox: the solution, then each test in its namespace; a tagged line per pass.
_HARNESS = r"""
import os, sys

def _run(solution, tests, tag):
    write = os.write  # bound before the solution runs: rebinding os.write later changes nothing
    sys.stdout = open(os.devnull, "w")  # the solution's prints must not mix with the results
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    exec(compile(solution, "solution.py", "exec"), namespace)
    for index, test in enumerate(tests):
        try:
            exec(compile(test, f"test_{index}.py", "exec"), namespace)
        except BaseException:  # SystemExit and friends fail one test, not the rest
            continue
        write(1, f"{tag} {index}\n".encode())
"""


class _Stats:
    """Outcome counts of this process's calls, and how many ran in the sandbox (thread-safe)."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.sandbox_runs = 0
        self.lock = threading.Lock()

    def count(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1

    def ran(self) -> None:
        with self.lock:
            self.sandbox_runs += 1


_STATS = _Stats()


def stats() -> dict[str, Any]:
    """This process's calls by outcome (:data:`OUTCOMES`) and its sandbox runs (cache misses)."""
    with _STATS.lock:
        outcomes = {name: _STATS.outcomes[name] for name in OUTCOMES}
        return {"outcomes": outcomes, "sandbox_runs": _STATS.sandbox_runs}


def parse_tests(reference: str) -> tuple[str, ...]:
    """The test statements of a reference (see the module docstring); ValueError when malformed."""
    try:
        value = json.loads(reference)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"code reference is not JSON: {str(reference)[:80]!r}") from exc
    tests = value.get("tests") if isinstance(value, dict) else value
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(
            f"code reference must be a non-empty JSON list of test strings or "
            f'{{"tests": [...]}}, got {str(reference)[:80]!r}'
        )
    return tuple(tests)


def extract_code(completion: str) -> str:
    """The code of a completion: its first fenced block's body, else all of it; dedented."""
    fenced = FENCE.search(completion)
    code = fenced.group(1) if fenced else completion
    return textwrap.dedent(code).strip("\n")


def _compiles(code: str) -> bool:
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def compiles(completion: str) -> bool:
    """Whether the completion holds code that compiles (the eval reports the share)."""
    code = extract_code(completion)
    return bool(code.strip()) and _compiles(code)


def _run_coroutine(coro: Any) -> ToolResult:
    """Run the sandbox call to completion from synchronous code, on a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called on a running loop (not through a scorer): a thread of its own, so asyncio.run works.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _count_passed(output: str, tag: str, n_tests: int) -> int:
    """Distinct tests the harness reported as passed (``"<tag> <index>"`` lines)."""
    passed = set()
    for line in output.splitlines():
        head, _, index = line.partition(" ")
        if head == tag and index.isdigit() and int(index) < n_tests:
            passed.add(int(index))
    return len(passed)


def _classify(result: ToolResult, passed: int, n_tests: int) -> str:
    if result.timed_out:
        return "timeout"
    if not result.ok:
        return "error"
    return "passed" if passed == n_tests else "failed"


@functools.lru_cache(maxsize=CACHE_SIZE)
def _score(code: str, tests: tuple[str, ...], sandbox: str, timeout_s: float) -> tuple[int, str]:
    """(tests passed, outcome) for ``code``; raises RuntimeError when the verifier cannot run."""
    if not code.strip():
        return 0, "no_code"
    if not _compiles(code):
        return 0, "syntax_error"
    tag = secrets.token_hex(16)
    program = f"{_HARNESS}\n_run({code!r}, {list(tests)!r}, {tag!r})\n"
    limits = SandboxLimits(
        wall_time_s=timeout_s,
        cpu_time_s=max(1, math.ceil(timeout_s)),
        max_output_bytes=4096 + 64 * len(tests),
        isolation=sandbox,
    )
    result = _run_coroutine(run_python(program, limits))
    _STATS.ran()
    if result.error.startswith(_VERIFIER_ERRORS):
        raise RuntimeError(result.error)
    n_passed = _count_passed(result.output, tag, len(tests))
    outcome = _classify(result, n_passed, len(tests))
    log.debug("code reward: %s (%d/%d) %s", outcome, n_passed, len(tests), result.error[:120])
    return n_passed, outcome


def run_tests(
    completion: str,
    reference: str,
    *,
    sandbox: str = "strict",
    sandbox_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[int, int, str]:
    """(tests passed, tests, outcome) for the code in ``completion`` against ``reference``."""
    tests = parse_tests(reference)
    passed, outcome = run_code(
        extract_code(completion), tests, sandbox=sandbox, sandbox_timeout_s=sandbox_timeout_s
    )
    return passed, len(tests), outcome


def run_code(
    code: str,
    tests: tuple[str, ...],
    *,
    sandbox: str = "strict",
    sandbox_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[int, str]:
    """(tests passed, outcome) for a program ``code`` and its ``tests``, run in the sandbox
    (cached, counted in :func:`stats`); RuntimeError when the verifier cannot run."""
    if not sandbox_timeout_s > 0:
        raise ValueError(f"sandbox_timeout_s must be > 0, got {sandbox_timeout_s}")
    passed, outcome = _score(code, tuple(tests), sandbox, float(sandbox_timeout_s))
    _STATS.count(outcome)
    return passed, outcome


@blocking
@with_completion_metrics(compiles=compiles)
def tests_passed_fraction(
    completion: str,
    reference: str,
    *,
    sandbox: str = "strict",
    sandbox_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """The share of the reference's tests that the completion's code passes, in [0, 1]."""
    passed, total, _ = run_tests(
        completion, reference, sandbox=sandbox, sandbox_timeout_s=sandbox_timeout_s
    )
    return passed / total


@blocking
@with_completion_metrics(compiles=compiles)
def all_tests_pass(
    completion: str,
    reference: str,
    *,
    sandbox: str = "strict",
    sandbox_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """1.0 when the completion's code passes every test of the reference, else 0.0."""
    passed, total, _ = run_tests(
        completion, reference, sandbox=sandbox, sandbox_timeout_s=sandbox_timeout_s
    )
    return float(passed == total)
