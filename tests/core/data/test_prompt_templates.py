"""Prompt templates: named ones and format strings."""

from __future__ import annotations

import pytest

from core.data import TEMPLATES, render_prompt
from core.data.templates import template_problems

pytestmark = pytest.mark.unit


def test_plain_ends_with_space_for_continuation() -> None:
    assert render_prompt("What is 2+3?") == "Question: What is 2+3?\nAnswer: "
    assert render_prompt("What is 2+3?", "plain") == "Question: What is 2+3?\nAnswer: "


def test_gsm8k_cot_matches_verl_instruction() -> None:
    assert render_prompt("What is 2+3?", "gsm8k_cot") == (
        'What is 2+3? Let\'s think step by step and output the final answer after "####".'
    )


def test_braces_in_question_are_kept() -> None:
    question = "A set {a, b} has {n} items?"
    for name in TEMPLATES:
        assert question in render_prompt(question, name)


def test_a_format_string_is_a_template() -> None:
    assert render_prompt("2+3?", "Q: {question}\nA: ") == "Q: 2+3?\nA: "


def test_template_problems_name_the_placeholder_or_the_valid_names() -> None:
    assert template_problems("plain") == [] and template_problems("Q: {question} A:") == []
    assert "'gsm8k_cot'" in template_problems("nope")[0]  # not a name, no {question}
    (problem,) = template_problems("Q: {qestion} A:")
    assert "['qestion']" in problem and "available: ['{question}']" in problem
    assert "not a valid format string" in template_problems("Q: {question")[0]
