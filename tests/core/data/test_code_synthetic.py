"""Synthetic code problems: determinism, solutions against their own tests, the SFT mix, splits."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from core.data.code_synthetic import (
    FAMILIES,
    CodeSpec,
    generate_code_problems,
    generate_code_splits,
)
from core.data.prompting import sft_target
from core.data.tabular import Columns, to_samples
from core.rewards.code import all_tests_pass
from core.runtime.stages import training_texts

pytestmark = pytest.mark.unit


def passed_tests(solution: str, answer: str) -> int:
    """Tests of ``answer`` that ``solution`` passes, run here: the generator's own code only."""
    namespace: dict = {}
    exec(solution, namespace)
    passed = 0
    for test in json.loads(answer):
        try:
            exec(test, namespace)
        except AssertionError:
            continue
        passed += 1
    return passed


def test_deterministic_per_seed_and_the_bug_share_leaves_the_problems_alone() -> None:
    spec = CodeSpec()
    first = generate_code_problems(200, spec, seed=3)
    assert first == generate_code_problems(200, spec, seed=3)
    assert first != generate_code_problems(200, spec, seed=4)
    no_bugs = generate_code_problems(200, CodeSpec(bug_fraction=0.0), seed=3)
    assert [s["question"] for s in no_bugs] == [s["question"] for s in first]
    assert [s["answer"] for s in no_bugs] == [s["answer"] for s in first]
    assert {s["style"] for s in no_bugs} == {"correct"}


def test_correct_solutions_pass_their_tests_and_the_off_by_one_fails_one() -> None:
    spec = CodeSpec(n_tests=3)
    samples = generate_code_problems(600, spec, seed=1)
    assert {s["family"] for s in samples} == set(FAMILIES)
    test = generate_code_problems(300, spec, seed=1, split="test")
    for sample in samples + test:
        tests = json.loads(sample["answer"])
        assert len(tests) == 3 and sample["question"].startswith("Write a function ")
        passed = passed_tests(sample["solution"], sample["answer"])
        if sample["style"] == "correct":
            assert passed == 3, sample
        else:
            assert passed < 3, sample
            fixed = sample["solution"].replace(" >= ", " > ").replace(" < ", " <= ")
            fixed = fixed.replace("))", " + 1))")
            assert passed_tests(fixed, sample["answer"]) == 3, sample
    assert {s["style"] for s in test} == {"correct"}  # held-out solutions are never buggy


def test_the_sft_mix_carries_the_bug_in_its_share_of_the_off_by_one_families() -> None:
    samples = generate_code_problems(3000, CodeSpec(bug_fraction=0.6), seed=2)
    styles = Counter(
        (FAMILIES[s["family"]].bug is not None, s["style"] == "off_by_one") for s in samples
    )
    assert styles[(False, True)] == 0  # families without a natural off-by-one stay correct
    share = styles[(True, True)] / (styles[(True, True)] + styles[(True, False)])
    assert 0.55 < share < 0.65


def test_the_sandboxed_reward_agrees_with_the_generator() -> None:
    samples = generate_code_problems(40, CodeSpec(), seed=5)
    by_style = {s["style"]: s for s in samples}
    right, buggy = by_style["correct"], by_style["off_by_one"]
    assert all_tests_pass(right["solution"], right["answer"], sandbox_timeout_s=3.0) == 1.0
    assert all_tests_pass(buggy["solution"], buggy["answer"], sandbox_timeout_s=3.0) == 0.0


def test_splits_keep_test_questions_out_of_train() -> None:
    train, test = generate_code_splits(CodeSpec(), n_train=1000, n_test=100, seed=1)
    assert len(train) == 1000 and len(test) == 100
    assert not {s["question"] for s in test} & {s["question"] for s in train}
    assert len({s["question"] for s in test}) == 100
    with pytest.raises(ValueError, match="widen the spec"):
        generate_code_splits(CodeSpec(families=["repeat"]), n_train=500, n_test=50, seed=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"families": []}, "must not be empty"),
        ({"families": ["plus", "divide"]}, "unknown"),
        ({"max_constant": 1}, "max_constant"),
        ({"n_tests": 0}, "n_tests"),
        ({"bug_fraction": 1.5}, "bug_fraction"),
    ],
)
def test_spec_is_validated(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CodeSpec(**kwargs)


def test_sft_trains_on_the_solution_and_the_reward_sees_the_tests() -> None:
    sample = generate_code_problems(1, CodeSpec(), seed=1)[0]
    assert sft_target(sample) == sample["solution"]
    assert sft_target({"question": "q", "answer": "#### 4"}) == "#### 4"  # GSM8K: the answer
    (text,) = training_texts([sample], "plain")
    assert text.endswith(sample["solution"]) and "assert" not in text


def test_a_tests_column_given_as_a_list_becomes_a_json_reference() -> None:
    rows = [{"prompt": "Write f(x) = x + 1.", "tests": ["assert f(1) == 2"], "solution": "s"}]
    (sample,) = to_samples(rows, Columns("prompt", "tests", metadata=("solution",)), "rows", "t")
    assert json.loads(sample["answer"]) == ["assert f(1) == 2"] and sft_target(sample) == "s"
