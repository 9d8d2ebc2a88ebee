"""Synthetic function-writing problems with tests, deterministic per seed (``code_synthetic``).

Each problem asks for a one-line Python function, "Write a function f(x) that returns the sum
of the integers from 3 to x inclusive.", and carries ``n_tests`` asserts on it. A sample is::

    {"id", "question", "answer": JSON list of asserts (what core.rewards.code checks),
     "solution": "def f(x):\\n    return sum(range(3, x + 1))" (the SFT target),
     "family", "style": "correct" | "off_by_one"}

Training solutions are deliberately mixed, as in :mod:`core.data.synthetic`: in the families
with a natural off-by-one (inclusive ranges, ``>`` against ``>=``), a ``bug_fraction`` share of
the SFT solutions carries it — well-formed code the tests reject. After SFT, greedy decoding
writes the bug on many of those problems while sampling still writes the fix now and then, which
gives RL with the test reward something to find. Held-out solutions are always correct.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from core.data.splits import SampleStream, first_samples, fresh_splits
from core.schema import documented

SPLITS: tuple[str, ...] = ("train", "test")
FUNCTION_NAMES: tuple[str, ...] = ("f", "g", "h", "calc")
_ARGS = {"int": ("x", "n", "m"), "str": ("s", "t", "w")}


@dataclass(frozen=True)
class _Family:
    """One kind of problem: ``{a}`` is the argument's name, ``{k}`` the problem's constant."""

    task: str  # "returns {a} plus {k}"
    body: str  # "{a} + {k}"
    bug: str | None  # the off-by-one body, or None
    expected: Callable[[int | str, int], object]
    arg: str  # "int" or "str"
    constants: Callable[[int], tuple[int, int]]  # max_constant -> (lowest, highest) k
    inputs: Callable[[random.Random, int, int], list[int | str]]  # (rng, k, n) -> test inputs


def _ints(rng: random.Random, k: int, n: int) -> list[int | str]:
    return list(rng.sample(range(0, 40), n))


def _from_k(rng: random.Random, k: int, n: int) -> list[int | str]:
    return list(rng.sample(range(k, k + 12), n))  # inclusive ranges from k: x >= k


def _around_k(rng: random.Random, k: int, n: int) -> list[int | str]:
    # x == k is the case an off-by-one comparison gets wrong; the others are on either side.
    others = rng.sample([k - d for d in range(1, 6)] + [k + d for d in range(1, 6)], n - 1)
    values: list[int | str] = [k, *others]
    rng.shuffle(values)
    return values


def _words(rng: random.Random, k: int, n: int) -> list[int | str]:
    return [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(k + 1, k + 5))) for _ in range(n)
    ]


FAMILIES: dict[str, _Family] = {
    "plus": _Family(
        "returns {a} plus {k}", "{a} + {k}", None, lambda x, k: x + k, "int",
        lambda m: (1, m), _ints,
    ),
    "times": _Family(
        "returns {a} times {k}", "{a} * {k}", None, lambda x, k: x * k, "int",
        lambda m: (2, min(9, m)), _ints,
    ),
    "minus": _Family(
        "returns {a} minus {k}", "{a} - {k}", None, lambda x, k: x - k, "int",
        lambda m: (1, m), _ints,
    ),
    "sum_to": _Family(
        "returns the sum of the integers from {k} to {a} inclusive",
        "sum(range({k}, {a} + 1))", "sum(range({k}, {a}))",
        lambda x, k: sum(range(k, x + 1)), "int", lambda m: (1, min(9, m)), _from_k,
    ),
    "list_to": _Family(
        "returns the list of the integers from {k} to {a} inclusive",
        "list(range({k}, {a} + 1))", "list(range({k}, {a}))",
        lambda x, k: list(range(k, x + 1)), "int", lambda m: (0, min(9, m)), _from_k,
    ),
    "above": _Family(
        "returns True when {a} is greater than {k}", "{a} > {k}", "{a} >= {k}",
        lambda x, k: x > k, "int", lambda m: (0, m), _around_k,
    ),
    "at_most": _Family(
        "returns True when {a} is at most {k}", "{a} <= {k}", "{a} < {k}",
        lambda x, k: x <= k, "int", lambda m: (0, m), _around_k,
    ),
    "first": _Family(
        "returns the first {k} characters of {a}", "{a}[:{k}]", None, lambda s, k: s[:k], "str",
        lambda m: (1, min(5, m)), _words,
    ),
    "last": _Family(
        "returns the last {k} characters of {a}", "{a}[-{k}:]", None, lambda s, k: s[-k:], "str",
        lambda m: (1, min(5, m)), _words,
    ),
    "repeat": _Family(
        "returns {a} repeated {k} times", "{a} * {k}", None, lambda s, k: s * k, "str",
        lambda m: (2, min(4, m)), _words,
    ),
}  # fmt: skip


@dataclass
class CodeSpec:
    """Knobs of the synthetic code problem generator."""

    # A list (not a tuple/Sequence) so that OmegaConf structured configs accept the field.
    families: list[str] = documented(
        list(FAMILIES),
        "Problem families to draw from: plus, times, minus, sum_to, list_to, above, at_most "
        "(the last four have an off-by-one variant), first, last, repeat.",
    )
    max_constant: int = documented(20, "Largest constant in a problem (k in 'x plus k').")
    n_tests: int = documented(3, "Asserts per problem.")
    bug_fraction: float = documented(
        0.6,
        "Share of TRAINING solutions of the off-by-one families that carry the off-by-one "
        "(well-formed code the tests reject), so RL has something to fix.",
    )

    def __post_init__(self) -> None:
        self.families = list(self.families)
        if not self.families:
            raise ValueError("families must not be empty")
        unknown = [name for name in self.families if name not in FAMILIES]
        if unknown:
            raise ValueError(f"families: unknown {unknown}; valid are {list(FAMILIES)}")
        if self.max_constant < 2:
            raise ValueError(f"max_constant must be >= 2, got {self.max_constant}")
        if not 1 <= self.n_tests <= 5:
            raise ValueError(f"n_tests must be in [1, 5], got {self.n_tests}")
        if not 0.0 <= self.bug_fraction <= 1.0:
            raise ValueError(f"bug_fraction must be in [0, 1], got {self.bug_fraction}")


@dataclass(frozen=True)
class _Problem:
    family: str
    name: str
    arg: str
    k: int
    inputs: tuple[int | str, ...]

    @property
    def spec(self) -> _Family:
        return FAMILIES[self.family]

    @property
    def question(self) -> str:
        task = self.spec.task.format(a=self.arg, k=self.k)
        return f"Write a function {self.name}({self.arg}) that {task}."

    def solution(self, buggy: bool = False) -> str:
        body = self.spec.bug if buggy and self.spec.bug else self.spec.body
        return f"def {self.name}({self.arg}):\n    return {body.format(a=self.arg, k=self.k)}"

    def tests(self) -> list[str]:
        return [
            f"assert {self.name}({x!r}) == {self.spec.expected(x, self.k)!r}" for x in self.inputs
        ]


def _sample_problem(rng: random.Random, spec: CodeSpec) -> _Problem:
    family = rng.choice(spec.families)
    kind = FAMILIES[family]
    name = rng.choice(FUNCTION_NAMES)
    arg = rng.choice(_ARGS[kind.arg])
    k = rng.randint(*kind.constants(spec.max_constant))
    return _Problem(family, name, arg, k, tuple(kind.inputs(rng, k, spec.n_tests)))


def _iter_problems(spec: CodeSpec, seed: int, split: str) -> Iterator[tuple[int, _Problem, bool]]:
    """Yield (index, problem, buggy) forever; only training solutions are ever buggy."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    # Separate streams: changing bug_fraction must not change the problems.
    problem_rng = random.Random(f"code-{seed}-{split}-problems")
    style_rng = random.Random(f"code-{seed}-{split}-style")
    i = 0
    while True:
        problem = _sample_problem(problem_rng, spec)
        buggy = style_rng.random() < spec.bug_fraction
        yield i, problem, split == "train" and buggy and problem.spec.bug is not None
        i += 1


def _to_sample(i: int, problem: _Problem, buggy: bool, seed: int, split: str) -> dict:
    return {
        "id": f"code-{split}-{seed}-{i}",
        "question": problem.question,
        "answer": json.dumps(problem.tests()),
        "solution": problem.solution(buggy),
        "family": problem.family,
        "style": "off_by_one" if buggy else "correct",
    }


def _stream(spec: CodeSpec, seed: int) -> SampleStream:
    def samples(split: str) -> Iterator[tuple[int, dict]]:
        for i, problem, buggy in _iter_problems(spec, seed, split):
            yield i, _to_sample(i, problem, buggy, seed, split)

    return samples


def generate_code_problems(n: int, spec: CodeSpec, seed: int, split: str = "train") -> list[dict]:
    """Generate ``n`` samples (see the module docstring); deterministic per ``seed``."""
    return first_samples(_stream(spec, seed), n, split)


def generate_code_splits(
    spec: CodeSpec, n_train: int, n_test: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """Train and test sets with no test question in train (nor twice in test).

    Raises ValueError when the spec's problem space is too small for ``n_test`` fresh questions.
    """
    widen = "widen the spec (families, max_constant) or lower n_train"
    return fresh_splits(_stream(spec, seed), n_train, n_test, widen)
