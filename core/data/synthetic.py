"""Synthetic GSM8K-style word problems, deterministic per seed.

Each problem starts with a person holding some objects and applies ``steps`` operations
(add, take away, multiply) to the count; the question asks for the final count. Solutions use
the GSM8K format (worked steps with ``<<a+b=c>>`` calculator annotations, ending in ``#### N``).

Training solutions are deliberately mixed: a ``direct_fraction`` share is answer-only
(``#### N``) and the rest is worked, spread over ``worked_phrasings`` phrasings. On a ~1M-param
model this makes greedy decoding after SFT prefer the (less accurate) direct style, which gives
RL something to discover: showing the work raised greedy accuracy from 0.415 to 0.555 with GRPO.
Keep that knob structure when changing the generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from core.data.splits import SampleStream, first_samples, fresh_splits
from core.schema import documented

OPERATIONS: tuple[str, ...] = ("+", "-", "*")
SPLITS: tuple[str, ...] = ("train", "test")

# fmt: off
# (name, subject pronoun)
_PEOPLE: tuple[tuple[str, str], ...] = (
    ("Finn", "he"), ("Mia", "she"), ("Leo", "he"),
    ("Ava", "she"), ("Omar", "he"), ("Nora", "she"),
    ("Ravi", "he"), ("Lena", "she"), ("Tom", "he"),
    ("Zoe", "she"), ("Ivan", "he"), ("Emma", "she"),
)
_OBJECTS: tuple[str, ...] = (
    "beads", "apples", "marbles", "stickers", "books", "pencils",
    "cookies", "stamps", "shells", "cards", "coins", "toy cars",
)
# fmt: on
# Templates per operation; {b} is the operand, {p} the subject pronoun.
_STEP_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": (
        "{p} buys {b} more.",
        "{p} finds {b} more.",
        "{name} gets {b} more {obj} from a friend.",
    ),
    "-": (
        "{p} gives away {b}.",
        "{p} loses {b}.",
        "{name} gives {b} {obj} to a friend.",
    ),
    # Phrased so that the new count is unambiguously k times the old one.
    "*": (
        "Then {p} ends up with {b} times as many {obj} as {p} had.",
        "After that, the number of {obj} {name} has becomes {b} times as large.",
    ),
}


TOOL_ANSWERS = ("worked", "result")


@dataclass
class SyntheticSpec:
    """Knobs of the synthetic problem generator."""

    min_steps: int = documented(1, "Fewest operations per problem.")
    max_steps: int = documented(2, "Most operations per problem.")
    max_operand: int = documented(10, "Largest starting count and added/removed amount.")
    # A list (not a tuple/Sequence) so that OmegaConf structured configs accept the field.
    operations: list[str] = documented(
        list(OPERATIONS), "Allowed operations, a subset of '+', '-', '*'."
    )
    max_multiplier: int = documented(
        3, "Multiplication is by 2..max_multiplier, so numbers stay small."
    )
    direct_fraction: float = documented(
        0.5, "Share of TRAINING solutions that are answer-only ('#### N')."
    )
    worked_phrasings: int = documented(2, "How many different worked-solution phrasings to use.")
    annotate: bool = documented(True, "Add GSM8K '<<a+b=c>>' calculator annotations to steps.")
    tool_calls: bool = documented(
        False,
        "Write worked steps as agent tool calls, '<calc>7-2</calc><result>5</result>', for the "
        "tool-agent workflow (the environment fills in <result> at rollout time).",
    )
    openai_tool_calls: bool = documented(
        False,
        "Give TRAINING rows a solved agent conversation for SFT (sft_messages, with tools): one "
        "OpenAI-style calc tool call per worked step, its result as a tool turn, then the "
        "worked answer; direct rows answer at once. For agents written against the OpenAI "
        "client (core.workflows.examples:calculator_agent, data.prompt_format=chat).",
    )
    tool_answer: str = documented(
        "worked",
        "With openai_tool_calls, what the solved conversations answer after their calc calls: "
        "'worked' (the worked phrasing, its arithmetic written out again) or 'result' ('#### "
        "N', the last call's result copied: every number of the episode then comes from the "
        "tool, so it is right whenever the calls are).",
    )

    def __post_init__(self) -> None:
        self.operations = list(self.operations)
        if self.min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {self.min_steps}")
        if self.max_steps < self.min_steps:
            raise ValueError(
                f"max_steps ({self.max_steps}) must be >= min_steps ({self.min_steps})"
            )
        # 2 is the least that leaves room for a subtraction that keeps the count positive.
        if self.max_operand < 2:
            raise ValueError(f"max_operand must be >= 2, got {self.max_operand}")
        if not self.operations:
            raise ValueError("operations must not be empty")
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if unknown:
            raise ValueError(f"operations: unknown {unknown}; valid are {list(OPERATIONS)}")
        if "*" in self.operations and self.max_multiplier < 2:
            raise ValueError(f"max_multiplier must be >= 2, got {self.max_multiplier}")
        # With subtraction only, each step removes >= 1 from a start <= max_operand.
        if set(self.operations) == {"-"} and self.max_steps >= self.max_operand:
            raise ValueError(
                f"max_steps ({self.max_steps}) must be < max_operand ({self.max_operand}) "
                "when '-' is the only operation"
            )
        if not 0.0 <= self.direct_fraction <= 1.0:
            raise ValueError(f"direct_fraction must be in [0, 1], got {self.direct_fraction}")
        if self.tool_answer not in TOOL_ANSWERS:
            raise ValueError(f"tool_answer={self.tool_answer!r} is not one of {list(TOOL_ANSWERS)}")
        if not 1 <= self.worked_phrasings <= len(_PHRASINGS):
            raise ValueError(
                f"worked_phrasings must be in [1, {len(_PHRASINGS)}], got {self.worked_phrasings}"
            )


@dataclass(frozen=True)
class _Step:
    a: int
    op: str
    b: int

    @property
    def result(self) -> int:
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        return self.a * self.b


@dataclass(frozen=True)
class _Problem:
    name: str
    pronoun: str
    obj: str
    start: int
    steps: tuple[_Step, ...]
    question: str

    @property
    def answer(self) -> int:
        return self.steps[-1].result


def _equation(step: _Step, spec: SyntheticSpec) -> str:
    expr = f"{step.a}{step.op}{step.b}"
    if spec.tool_calls:  # the agent asks a calculator tool; the environment answers
        return f"<calc>{expr}</calc><result>{step.result}</result>"
    if spec.annotate:
        return f"{expr}=<<{expr}={step.result}>>{step.result}"
    return f"{expr}={step.result}"


def _phrasing_equations(problem: _Problem, spec: SyntheticSpec) -> str:
    # e.g. "7-2=<<7-2=5>>5. 5*3=<<5*3=15>>15."
    return " ".join(f"{_equation(s, spec)}." for s in problem.steps)


def _phrasing_narrated(problem: _Problem, spec: SyntheticSpec) -> str:
    # e.g. "Finn has 7-2=<<7-2=5>>5 beads. Then Finn has 5*3=<<5*3=15>>15 beads."
    parts = []
    for i, step in enumerate(problem.steps):
        lead = f"{problem.name} has" if i == 0 else f"Then {problem.name} has"
        parts.append(f"{lead} {_equation(step, spec)} {problem.obj}.")
    return " ".join(parts)


def _phrasing_ordinal(problem: _Problem, spec: SyntheticSpec) -> str:
    # e.g. "First, 7-2=<<7-2=5>>5. Next, 5*3=<<5*3=15>>15."
    return " ".join(
        f"{'First' if i == 0 else 'Next'}, {_equation(s, spec)}."
        for i, s in enumerate(problem.steps)
    )


_PHRASINGS: tuple[Callable[[_Problem, SyntheticSpec], str], ...] = (
    _phrasing_equations,
    _phrasing_narrated,
    _phrasing_ordinal,
)


def _sample_operations(rng: random.Random, spec: SyntheticSpec) -> list[str]:
    n_steps = rng.randint(spec.min_steps, spec.max_steps)
    ops = [rng.choice(spec.operations) for _ in range(n_steps)]
    # Each subtraction needs one unit of headroom in the start value (see _sample_problem),
    # so cap the subtractions at max_operand - 1 by swapping extras for another operation.
    others = [op for op in spec.operations if op != "-"]
    budget = spec.max_operand - 1
    for i, op in enumerate(ops):
        if op == "-":
            if budget == 0 and others:
                ops[i] = rng.choice(others)
            else:
                budget -= 1
    return ops


def _sample_problem(rng: random.Random, spec: SyntheticSpec) -> _Problem:
    name, pronoun = rng.choice(_PEOPLE)
    obj = rng.choice(_OBJECTS)
    ops = _sample_operations(rng, spec)
    n_minus = ops.count("-")
    # Starting above the number of subtractions, and removing at most current-1-remaining,
    # keeps every intermediate count >= 1 (no negatives, no zero). Start >= 2 reads better.
    current = rng.randint(max(2, n_minus + 1), spec.max_operand)
    start = current
    steps: list[_Step] = []
    sentences = [f"{name} has {current} {obj}."]
    for i, op in enumerate(ops):
        if op == "+":
            b = rng.randint(1, spec.max_operand)
        elif op == "-":
            n_minus -= 1
            b = rng.randint(1, min(spec.max_operand, current - 1 - n_minus))
        else:
            b = rng.randint(2, spec.max_multiplier)
        template = rng.choice(_STEP_TEMPLATES[op])
        sentence = template.format(b=b, name=name, obj=obj, p=pronoun)
        if template.startswith("{p}"):
            # Later events get "Then" so that the order of operations is explicit.
            sentence = f"Then {sentence}" if i > 0 else sentence[0].upper() + sentence[1:]
        elif i > 0 and template.startswith("{name}"):
            sentence = f"Then {sentence}"
        steps.append(_Step(current, op, b))
        current = steps[-1].result
        sentences.append(sentence)
    sentences.append(f"How many {obj} does {name} have now?")
    return _Problem(name, pronoun, obj, start, tuple(steps), " ".join(sentences))


def _iter_problems(
    spec: SyntheticSpec, seed: int, split: str
) -> Iterator[tuple[int, _Problem, str]]:
    """Yield (index, problem, style) forever; style is 'direct' or 'worked:<phrasing>'."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    # Separate streams: changing direct_fraction/worked_phrasings must not change the
    # questions, so ablations over the solution mix see the same problem set.
    problem_rng = random.Random(f"synthetic-{seed}-{split}-problems")
    style_rng = random.Random(f"synthetic-{seed}-{split}-style")
    i = 0
    while True:
        problem = _sample_problem(problem_rng, spec)
        direct = style_rng.random() < spec.direct_fraction
        phrasing = style_rng.randrange(spec.worked_phrasings)
        if split == "train" and direct:
            yield i, problem, "direct"
        else:
            # The test split is only a reference solution, so it is always worked.
            yield i, problem, f"worked:{phrasing}"
        i += 1


def _to_sample(
    i: int, problem: _Problem, style: str, spec: SyntheticSpec, seed: int, split: str
) -> dict:
    if style == "direct":
        answer = f"#### {problem.answer}"
    else:
        phrasing = _PHRASINGS[int(style.split(":")[1])]
        answer = f"{phrasing(problem, spec)}\n#### {problem.answer}"
    sample = {
        "id": f"synthetic-{split}-{seed}-{i}",
        "question": problem.question,
        "answer": answer,
        "style": "direct" if style == "direct" else "worked",
    }
    if spec.openai_tool_calls and split == "train":
        direct = style == "direct"
        final = answer if direct or spec.tool_answer == "worked" else f"#### {problem.answer}"
        sample["sft_messages"] = _solved_conversation(problem, final, direct)
        sample["tools"] = [CALCULATOR_TOOL]
    return sample


# The calculator as an OpenAI tool (core.workflows.examples:calculator_agent offers the same one).
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression, e.g. 3*(4+5).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def _solved_conversation(problem: _Problem, answer: str, direct: bool) -> list[dict]:
    """The assistant and tool turns of a solved episode: a calc call per step, then ``answer``."""
    messages: list[dict] = []
    for k, step in enumerate([] if direct else problem.steps):
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "calc", "arguments": {"expression": f"{step.a}{step.op}{step.b}"}}}  # fmt: skip
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": str(step.result)})
    return [*messages, {"role": "assistant", "content": answer}]


def _stream(spec: SyntheticSpec, seed: int) -> SampleStream:
    def samples(split: str) -> Iterator[tuple[int, dict]]:
        for i, problem, style in _iter_problems(spec, seed, split):
            yield i, _to_sample(i, problem, style, spec, seed, split)

    return samples


def generate_problems(n: int, spec: SyntheticSpec, seed: int, split: str = "train") -> list[dict]:
    """Generate ``n`` samples ``{"id", "question", "answer", "style"}``; deterministic."""
    return first_samples(_stream(spec, seed), n, split)


def generate_splits(
    spec: SyntheticSpec, n_train: int, n_test: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """Generate train and test sets such that no test question appears in train (see
    :func:`core.data.splits.fresh_splits`)."""
    return fresh_splits(
        _stream(spec, seed), n_train, n_test, "widen the spec (steps, max_operand, operations)"
    )
