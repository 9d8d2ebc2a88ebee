"""Hermes/Qwen tool calls parsed into OpenAI tool calls; malformed ones reported, never raised."""

from __future__ import annotations

import json

import pytest

from core.inference.tool_calls import error_message, parse_tool_calls

pytestmark = pytest.mark.unit


def test_text_without_calls_is_all_content() -> None:
    turn = parse_tool_calls("  The answer is 42. ")
    assert (turn.content, turn.tool_calls, turn.errors) == ("The answer is 42.", [], [])


def test_calls_become_openai_tool_calls() -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "search", "arguments": {"query": "Oslo"}}\n'
            '</tool_call>\n<tool_call>{"name": "open", "arguments": "{\\"doc_id\\": 3}"}</tool_call>')  # fmt: skip
    turn = parse_tool_calls(text)
    assert turn.content == "Let me check." and turn.errors == []
    assert [c["function"]["name"] for c in turn.tool_calls] == ["search", "open"]
    assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"query": "Oslo"}
    assert json.loads(turn.tool_calls[1]["function"]["arguments"]) == {"doc_id": 3}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in turn.tool_calls)
    assert turn.tool_calls[0]["id"] != turn.tool_calls[1]["id"]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("{not json}", "not valid JSON"),
        ('{"arguments": {}}', 'needs a "name"'),
        ('["search"]', 'needs a "name"'),
        ('{"name": "search", "arguments": [1, 2]}', "must be an object"),
        ('{"name": "search", "arguments": "{oops"}', "string that is not JSON"),
    ],
)
def test_malformed_calls_are_errors_beside_the_good_ones(body: str, why: str) -> None:
    text = (
        f'<tool_call>{body}</tool_call><tool_call>{{"name": "ok", "arguments": {{}}}}</tool_call>'
    )
    turn = parse_tool_calls(text)
    assert [c["function"]["name"] for c in turn.tool_calls] == ["ok"]
    assert len(turn.errors) == 1 and why in turn.errors[0]
    assert error_message(turn.errors[0]) == {"role": "tool", "content": f"error: {turn.errors[0]}"}


def test_an_unclosed_call_is_an_error() -> None:
    turn = parse_tool_calls('Searching <tool_call>{"name": "search", "arguments": {"q')
    assert turn.content == "Searching" and turn.tool_calls == []
    assert len(turn.errors) == 1 and "unclosed" in turn.errors[0]
