"""Synthetic GSM8K-style generator: determinism, knobs, arithmetic, solution mix, splits."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from core.data import SyntheticSpec, generate_problems, generate_splits, validate_rows

pytestmark = pytest.mark.unit

# "7-2=<<7-2=5>>5" or, unannotated, "7-2=5"
_EQ = re.compile(r"(\d+)([+\-*])(\d+)=(?:<<(\d+)([+\-*])(\d+)=(\d+)>>)?(\d+)")
_FINAL = re.compile(r"\n?#### (\d+)$")


def _steps(answer: str) -> list[tuple[int, str, int, int]]:
    """(a, op, b, c) for every equation of a worked solution, checking annotations agree."""
    steps = []
    for m in _EQ.finditer(answer):
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[8])
        if m[4] is not None:
            assert (int(m[4]), m[5], int(m[6]), int(m[7])) == (a, op, b, c), answer
        steps.append((a, op, b, c))
    return steps


def _apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def _solve_question(question: str) -> tuple[int, list[tuple[str, int]]]:
    """Answer computed from the question text alone, plus its (op, operand) sequence."""
    sentences = question.split(". ")
    value = int(re.search(r" has (\d+) ", sentences[0])[1])
    ops = []
    for sentence in sentences[1:]:
        if m := re.search(r"(\d+) times", sentence):
            ops.append(("*", int(m[1])))
        elif m := re.search(r"(?:gives away|loses|gives) (\d+)", sentence):
            ops.append(("-", int(m[1])))
        elif m := re.search(r"(?:buys|finds|gets) (\d+) more", sentence):
            ops.append(("+", int(m[1])))
        else:
            assert sentence.startswith("How many"), sentence
    for op, b in ops:
        value = _apply(value, op, b)
    return value, ops


def _final(answer: str) -> int:
    m = _FINAL.search(answer)
    assert m, answer
    return int(m[1])


def test_spec_fields_have_help() -> None:
    for f in fields(SyntheticSpec):
        assert f.metadata.get("help"), f.name


def test_same_seed_is_identical_and_seeds_differ() -> None:
    spec = SyntheticSpec()
    a = generate_problems(200, spec, seed=3)
    assert a == generate_problems(200, spec, seed=3)
    b = generate_problems(200, spec, seed=4)
    assert sum(x["question"] == y["question"] for x, y in zip(a, b, strict=True)) < 10
    assert [r["id"] for r in a[:2]] == ["synthetic-train-3-0", "synthetic-train-3-1"]
    test = generate_problems(5, spec, seed=3, split="test")
    assert test[0]["id"] == "synthetic-test-3-0"


def test_prefix_stable_and_mix_does_not_change_questions() -> None:
    spec = SyntheticSpec()
    assert generate_problems(50, spec, 1) == generate_problems(80, spec, 1)[:50]
    other_mix = SyntheticSpec(direct_fraction=0.9, worked_phrasings=1)
    assert [r["question"] for r in generate_problems(50, spec, 1)] == [
        r["question"] for r in generate_problems(50, other_mix, 1)
    ]


@pytest.mark.parametrize(
    "spec",
    [
        SyntheticSpec(),
        SyntheticSpec(min_steps=3, max_steps=5, max_operand=20, max_multiplier=4),
        SyntheticSpec(operations=("-",), min_steps=4, max_steps=4, max_operand=5),
        SyntheticSpec(operations=("-", "*"), max_steps=6, max_operand=3),
    ],
)
def test_worked_solutions_are_correct_and_respect_knobs(spec: SyntheticSpec) -> None:
    rows = generate_problems(300, spec, seed=7, split="test")
    assert validate_rows(rows, "synthetic", strict=True) == rows
    for row in rows:
        assert row["style"] == "worked"
        steps = _steps(row["answer"])
        truth, ops = _solve_question(row["question"])
        assert spec.min_steps <= len(steps) <= spec.max_steps
        assert [(op, b) for _, op, b, _ in steps] == ops
        start = int(re.search(r" has (\d+) ", row["question"])[1])
        assert 1 <= start <= spec.max_operand
        previous = start
        for a, op, b, c in steps:
            assert a == previous and c == _apply(a, op, b), row
            assert op in spec.operations
            assert c >= 1  # no negative (or empty) intermediate counts
            if op == "*":
                assert 2 <= b <= spec.max_multiplier
            else:
                assert 1 <= b <= spec.max_operand
            previous = c
        assert _final(row["answer"]) == previous == truth


def test_direct_fraction_and_phrasings() -> None:
    rows = generate_problems(2000, SyntheticSpec(direct_fraction=0.5, worked_phrasings=2), 0)
    direct = [r for r in rows if r["style"] == "direct"]
    worked = [r for r in rows if r["style"] == "worked"]
    assert 0.45 < len(direct) / len(rows) < 0.55
    for r in direct:
        assert re.fullmatch(r"#### \d+", r["answer"])
        assert int(r["answer"][5:]) == _solve_question(r["question"])[0]
    # Phrasing A starts with the first equation, phrasing B with the person's name.
    starts_with_digit = sum(r["answer"][0].isdigit() for r in worked)
    assert 0.4 < starts_with_digit / len(worked) < 0.6
    for r in worked:
        assert r["answer"][0].isdigit() or r["answer"].split()[0] in r["question"]
        assert _final(r["answer"]) == _solve_question(r["question"])[0]


def test_phrasing_examples_and_annotate_off() -> None:
    spec = SyntheticSpec(direct_fraction=0.0, worked_phrasings=3, min_steps=2)
    answers = [r["answer"] for r in generate_problems(100, spec, 0)]
    assert any(re.fullmatch(r"\d+[-+*]\d+=<<.*>>\d+\. \d+.*\n#### \d+", a) for a in answers)
    assert any(re.match(r"[A-Z][a-z]+ has \d+[-+*]\d+=<<", a) for a in answers)
    assert any(a.startswith("First, ") and ". Next, " in a for a in answers)

    plain = generate_problems(100, SyntheticSpec(direct_fraction=0.0, annotate=False), 0)
    assert all("<<" not in r["answer"] for r in plain)
    for r in plain:
        assert _final(r["answer"]) == _solve_question(r["question"])[0]


def test_extreme_fractions_and_test_split_always_worked() -> None:
    assert all(
        r["style"] == "direct" for r in generate_problems(200, SyntheticSpec(direct_fraction=1), 0)
    )
    assert all(
        r["style"] == "worked" for r in generate_problems(200, SyntheticSpec(direct_fraction=0), 0)
    )
    test = generate_problems(200, SyntheticSpec(direct_fraction=1.0), 0, split="test")
    assert all(r["style"] == "worked" and "<<" in r["answer"] for r in test)


def test_generate_splits_has_no_overlap() -> None:
    # A tiny problem space (1 step, '+' only, operands <= 2) makes collisions certain.
    spec = SyntheticSpec(min_steps=1, max_steps=1, operations=("+",), max_operand=2)
    train, test = generate_splits(spec, n_train=400, n_test=100, seed=5)
    assert len(train) == 400 and len(test) == 100
    train_questions = {r["question"] for r in train}
    naive = generate_problems(100, spec, 5, split="test")
    assert any(r["question"] in train_questions for r in naive)  # the guard is needed
    assert not any(r["question"] in train_questions for r in test)
    assert len({r["question"] for r in test}) == len({r["id"] for r in test}) == 100
    assert all(r["id"].startswith("synthetic-test-5-") for r in test)
    assert generate_splits(spec, 400, 100, 5) == (train, test)


def test_generate_splits_space_too_small() -> None:
    # 12 names x 12 objects x 3 phrasings, start 2, minus 1: 432 distinct questions.
    spec = SyntheticSpec(min_steps=1, max_steps=1, operations=("-",), max_operand=2)
    with pytest.raises(ValueError, match="widen the spec"):
        generate_splits(spec, n_train=10, n_test=500, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_steps": 0}, "min_steps"),
        ({"min_steps": 3, "max_steps": 2}, "max_steps"),
        ({"max_operand": 1}, "max_operand"),
        ({"operations": ("+", "/")}, "operations"),
        ({"operations": ()}, "operations"),
        ({"max_multiplier": 1}, "max_multiplier"),
        ({"direct_fraction": 1.5}, "direct_fraction"),
        ({"direct_fraction": -0.1}, "direct_fraction"),
        ({"worked_phrasings": 0}, "worked_phrasings"),
        ({"worked_phrasings": 99}, "worked_phrasings"),
        ({"operations": ("-",), "max_steps": 10, "max_operand": 10}, "max_steps"),
    ],
)
def test_invalid_spec_names_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SyntheticSpec(**kwargs)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="split"):
        generate_problems(1, SyntheticSpec(), 0, split="validation")
    with pytest.raises(ValueError, match="n must be"):
        generate_problems(-1, SyntheticSpec(), 0)
    assert generate_problems(0, SyntheticSpec(), 0) == []


def test_spec_works_as_omegaconf_structured_config() -> None:
    # core.config embeds SyntheticSpec in the experiment schema, loaded through OmegaConf.
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(
        OmegaConf.structured(SyntheticSpec), {"operations": ["+", "*"], "max_steps": 3}
    )
    spec = OmegaConf.to_object(merged)
    assert isinstance(spec, SyntheticSpec)
    assert spec.operations == ["+", "*"] and spec.max_steps == 3
    assert OmegaConf.to_container(OmegaConf.structured(spec))["operations"] == ["+", "*"]


def test_tool_call_solutions_match_the_calculator() -> None:
    """With tool_calls, every worked step is a <calc> call whose <result> the calculator agrees with."""
    import re

    from core.rewards.gsm8k import gsm8k_reward
    from core.workflows.tools import calculator

    samples = generate_problems(300, SyntheticSpec(tool_calls=True, max_steps=3), seed=5)
    worked = [s for s in samples if s["style"] == "worked"]
    assert worked and all("<<" not in s["answer"] for s in worked)
    for sample in worked:
        calls = re.findall(r"<calc>(.*?)</calc><result>(.*?)</result>", sample["answer"])
        assert calls
        assert all(calculator(expr) == result for expr, result in calls)
        assert gsm8k_reward(sample["answer"], sample["answer"]) == 1.0
