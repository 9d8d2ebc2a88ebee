"""GSM8K answer extraction and reward: a format table plus every row of the bundled test split."""

import json
import re
from functools import cache
from pathlib import Path

import pytest

import core
from core.rewards.gsm8k import extract_answer, gsm8k_reward, is_direct_answer, parse_number

pytestmark = pytest.mark.unit

TEST_SPLIT = Path(core.__file__).parent / "data" / "gsm8k" / "test.jsonl"
FINAL = re.compile(r"####\s*(\S+)\s*$")
SOLUTION = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
    "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.\n"
)


@cache
def rows() -> list[dict[str, str]]:
    with TEST_SPLIT.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def final_number(answer: str) -> int:
    """The integer after "####" in a dataset answer field (commas allowed, e.g. 1,450,000)."""
    match = FINAL.search(answer)
    assert match is not None, answer
    return int(match[1].replace(",", ""))


# --- the bundled test split -------------------------------------------------------------------


def test_split_is_complete() -> None:
    assert len(rows()) == 1319


def test_every_solution_scores_its_own_answer() -> None:
    bad = [i for i, r in enumerate(rows()) if gsm8k_reward(r["answer"], r["answer"]) != 1.0]
    assert bad == []


def test_every_reference_parses_to_its_marked_number() -> None:
    bad = [
        i
        for i, r in enumerate(rows())
        if parse_number(extract_answer(r["answer"]) or "") != final_number(r["answer"])
    ]
    assert bad == []


def test_changed_marker_number_scores_zero() -> None:
    bad = []
    for i, r in enumerate(rows()):
        wrong = FINAL.sub(f"#### {final_number(r['answer']) + 1}", r["answer"])
        if gsm8k_reward(wrong, r["answer"]) != 0.0:
            bad.append(i)
    assert bad == []


@pytest.mark.parametrize(
    "template",
    ["The answer is {}.", "The answer is ${:,}.", "Final answer: {} dollars", "\\boxed{{{}}}"],
)
def test_final_line_in_other_formats(template: str) -> None:
    """The body keeps its annotations and true intermediate numbers; only the last line differs.

    Writing the right number in another format scores 1.0 (so the 0.0 below is not a parse
    failure), and writing N+1 scores 0.0 for every row.
    """
    right, wrong = [], []
    for i, r in enumerate(rows()):
        n = final_number(r["answer"])
        body = FINAL.sub("", r["answer"])
        if gsm8k_reward(body + template.format(n), r["answer"]) != 1.0:
            right.append(i)
        if gsm8k_reward(body + template.format(n + 1), r["answer"]) != 0.0:
            wrong.append(i)
    assert (right, wrong) == ([], [])


def test_no_dataset_solution_is_a_direct_answer() -> None:
    assert [i for i, r in enumerate(rows()) if is_direct_answer(r["answer"])] == []


def test_dataset_oddities_are_covered() -> None:
    """The split has comma-grouped and negative answers; both must round-trip."""
    finals = [FINAL.search(r["answer"])[1] for r in rows()]
    assert any("," in f for f in finals)
    assert any(f.startswith("-") for f in finals)


# --- the format table -------------------------------------------------------------------------

EXTRACT_CASES = [
    ("#### 18", "18"),
    ("so she makes 18.\n#### 18", "18"),
    ("#### $1,234.50", "1234.50"),
    ("#### -3", "-3"),
    ("#### 18 dollars.", "18"),
    ("The answer is 18.", "18"),
    ("the final answer is $18!", "18"),
    ("Answer: 3/4", "3/4"),
    ("**Answer:** 1,450,000", "1450000"),
    ("answer = -7", "-7"),
    ("\\boxed{18}", "18"),
    ("\\boxed{\\frac{3}{4}}", "3/4"),
    ("\\boxed{\\$1,234}", "1234"),
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("$1,234.50", "1234.50"),
    ("18.0", "18.0"),
    ("-3", "-3"),
    ("\u22124", "-4"),
    ("3/4", "3/4"),
    ("18 dollars.", "18"),
    ("18%", "18"),
    ("18!", "18"),
    ("She had 5 apples and ate 2, leaving 3 apples.", "3"),
    ("16-3 leaves", "3"),  # a subtraction, not the number -3
    ("1,2,3", "3"),  # a list, not a thousands-grouped number
    (SOLUTION, "18"),  # "$<<9*2=18>>18": the annotation is dropped, the 18 after it stays
    ("It is 9 <<9*2=18>>", "9"),  # annotations alone are never answers
    ("#### 18\n\\boxed{5}", "18"),  # "####" outranks \boxed
    ("\\boxed{5}. The answer is 6", "5"),  # \boxed outranks phrasing
    ("The answer is 6. Check: 2 * 3 = 6, 7 left", "6"),  # phrasing outranks the last number
    ("#### Step 1\n2 + 2 = 4", "4"),  # a markdown heading is not a marker
    ("no numbers here", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT_CASES)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("18", 18.0),
        ("18.0", 18.0),
        ("-3", -3.0),
        ("3/4", 0.75),
        ("$1,234.50", 1234.5),
        ("1,450,000", 1450000.0),
        ("18 dollars", 18.0),
        ("18%", 18.0),
        (".5", 0.5),
        ("1/0", None),
        ("9" * 400, None),  # overflows a float
        ("abc", None),
        ("", None),
    ],
)
def test_parse_number(text: str, expected: float | None) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("#### 18", "18", 1.0),
        ("The answer is 18.", "#### 18", 1.0),
        ("The answer is 18.0", "18", 1.0),
        ("\\boxed{18}", "18", 1.0),
        ("#### 1234", "#### 1,234", 1.0),
        ("It costs $1,234.", "1234", 1.0),
        ("#### -10", "#### -10", 1.0),
        ("#### 10", "#### -10", 0.0),
        ("#### 0.75", "3/4", 1.0),
        ("#### 3/4", "0.75", 1.0),
        ("#### 18.0000000001", "18", 1.0),  # within tolerance
        ("#### 18.01", "18", 0.0),
        ("#### 19", "18", 0.0),
        (SOLUTION + "#### 9", "18", 0.0),  # intermediate results do not count
        ("I cannot solve this.", "18", 0.0),
        ("#### banana", "18", 0.0),
        ("", "18", 0.0),
        ("\\boxed{" * 5000, "18", 0.0),
        ("9" * 5000, "18", 0.0),
        (None, "18", 0.0),
        (18, "18", 0.0),
    ],
)
def test_gsm8k_reward(completion: str, reference: str, expected: float) -> None:
    assert gsm8k_reward(completion, reference) == expected


@pytest.mark.parametrize("reference", ["", "no number", "#### unknown", None])
def test_reference_without_number_raises(reference: str) -> None:
    with pytest.raises(ValueError, match="reference has no parsable number"):
        gsm8k_reward("#### 18", reference)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("#### 18", True),
        ("  \n#### $1,234", True),
        ("I think it is\n#### 18", True),
        ("9 * 2 = 18\n#### 18", False),
        ("She makes $<<9*2=18>>18\n#### 18", False),
        ("The answer is 18.", False),  # no marker at all
        ("#### Step 1", False),  # a heading, not an answer
        ("", False),
    ],
)
def test_is_direct_answer(completion: str, expected: bool) -> None:
    assert is_direct_answer(completion) is expected


@pytest.mark.parametrize("answer", [1_450_000, 2_880_000, 192_000_000])
def test_off_by_one_on_large_answers_scores_zero(answer: int) -> None:
    """GSM8K has answers this large; a relative tolerance of 1e-6 would accept answer + 1."""
    assert gsm8k_reward(f"#### {answer + 1:,}", f"#### {answer:,}") == 0.0
    assert gsm8k_reward(f"#### {answer:,}", f"#### {answer}") == 1.0
