"""Prompt templates: rendering, chat messages, unknown names."""

from __future__ import annotations

import pytest

from core.data import TEMPLATES, chat_messages, render_prompt

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


def test_chat_messages() -> None:
    messages = chat_messages("What is 2+3?", "gsm8k_cot")
    assert messages == [{"role": "user", "content": render_prompt("What is 2+3?", "gsm8k_cot")}]
    assert chat_messages("Q", "plain")[0]["content"] == "Question: Q\nAnswer: "


def test_unknown_template_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*'gsm8k_cot'.*'plain'"):
        render_prompt("Q", "nope")
    with pytest.raises(ValueError, match="plain"):
        chat_messages("Q", "nope")
