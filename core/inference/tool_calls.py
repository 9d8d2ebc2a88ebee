"""Tool calls in a model's text, Hermes/Qwen style, as OpenAI ``tool_calls``.

Qwen2.5 and the Hermes models write a call as a JSON object between tags::

    Let me look that up.
    <tool_call>
    {"name": "search", "arguments": {"query": "capital of Norway"}}
    </tool_call>

:func:`parse_tool_calls` returns the text before the first call as the message content, each
well-formed call as an OpenAI tool call (``arguments`` a JSON string, as the OpenAI API sends
it), and one error string per malformed call (not JSON, no ``name``, ``arguments`` not an
object, an unclosed tag). Malformed calls never raise: the agent answers them with a tool error
message (:func:`error_message`) and the model gets to try again.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass
class ParsedTurn:
    """A model turn split into its message content, tool calls and malformed-call errors."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI shape
    errors: list[str] = field(default_factory=list)


def _call(body: str) -> dict[str, Any] | str:
    """One tag's body as an OpenAI tool call, or why it is not one."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return f"tool call is not valid JSON ({err.msg} at char {err.pos}): {body.strip()[:200]!r}"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return f'tool call needs a "name" string: {body.strip()[:200]!r}'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments already encoded
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f'tool call {call["name"]!r}: "arguments" is a string that is not JSON'
    if not isinstance(arguments, dict):
        return f'tool call {call["name"]!r}: "arguments" must be an object'
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(arguments)},
    }


def parse_tool_calls(text: str) -> ParsedTurn:
    """Split ``text`` (a model turn, special tokens removed) into content, calls and errors."""
    first = text.find(OPEN)
    if first < 0:
        return ParsedTurn(text.strip())
    turn = ParsedTurn(text[:first].strip())
    for match in _CALL.finditer(text):
        parsed = _call(match.group(1))
        if isinstance(parsed, str):
            turn.errors.append(parsed)
        else:
            turn.tool_calls.append(parsed)
    closed = text.count(CLOSE)
    if text.count(OPEN) > closed:
        turn.errors.append(f"unclosed {OPEN}: {text[text.rfind(OPEN) :][:200]!r}")
    return turn


def error_message(error: str) -> dict[str, Any]:
    """The message that answers a malformed call: a tool turn with the error, so the model sees
    why its call did not run (chat templates render it like any tool result)."""
    return {"role": "tool", "content": f"error: {error}"}


def tool_arguments(name: str, arguments: str | None) -> dict[str, Any] | str:
    """A call's JSON arguments as a dict, or the error result to answer a malformed call with."""
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return f"error: {name} arguments are not JSON: {arguments!r:.200}"
    if not isinstance(parsed, dict):
        return f"error: {name} arguments must be an object"
    return parsed
