"""Chat completions in the OpenAI shape over token ids: rendering, parsing, the response body.

Both the in-process client (:mod:`core.workflows.openai_client`) and the server's
``POST /v1/chat/completions`` render ``messages`` (+ ``tools``) with the tokenizer's chat
template, generate from the ids, split the reply with
:func:`core.inference.tool_calls.parse_tool_calls` and answer with the OpenAI ``chat.completion`` body built here. One code path, so an agent sees
the same thing in the trainer's process and through the ``openai`` package against our server.

Real chat models bring their own template; the tiny models we build get
:data:`core.models.chat_template.TOOL_CHAT_TEMPLATE`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from core.inference.tool_calls import ParsedTurn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")


def normalize_message(message: Any, index: int = 0) -> dict[str, Any]:
    """A chat message as a plain dict of the fields templates read: a dict, or an OpenAI SDK
    object (``model_dump``), ``content`` None -> "", tool-call ``arguments`` decoded to a dict
    (chat templates take them as objects; the OpenAI API sends JSON strings)."""
    if hasattr(message, "model_dump"):
        message = message.model_dump(exclude_none=True)
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError(f"messages[{index}] must be an object with a 'role' string")
    out = {k: message[k] for k in _KEEP if message.get(k) is not None}
    content = out.get("content", "")
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise ValueError(f"messages[{index}].content must be a string or text parts")
    out["content"] = content
    calls = []
    for j, call in enumerate(out.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"messages[{index}].tool_calls[{j}] needs function.name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                raise ValueError(
                    f"messages[{index}].tool_calls[{j}].function.arguments is not JSON"
                ) from None
        calls.append({"id": call.get("id", ""), "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})  # fmt: skip
    if calls:
        out["tool_calls"] = calls
    else:
        out.pop("tool_calls", None)
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list | tuple) or not messages:
        raise ValueError("messages must be a non-empty list")
    return [normalize_message(m, i) for i, m in enumerate(messages)]


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The conversation as the chat template writes it (special tokens as text)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat completions need a tokenizer with a chat template; this one has none"
        )
    return str(tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                             add_generation_prompt=add_generation_prompt))  # fmt: skip


def assistant_message(turn: ParsedTurn) -> dict[str, Any]:
    """The reply as an OpenAI assistant message (tool-call arguments as JSON strings)."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    if turn.errors:  # our extension: why a tool call the model wrote could not be parsed
        message["tool_call_errors"] = turn.errors
    return message


def finish_reason(turn: ParsedTurn, stop_reason: str) -> str:
    if turn.tool_calls:
        return "tool_calls"
    return "length" if stop_reason == "length" else "stop"


def completion_body(
    *,
    model: str,
    message: dict[str, Any],
    finish: str,
    prompt_tokens: int,
    completion_ids: list[int],
    logprobs: list[float] | None = None,
    versions: list[int] | None = None,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` body. Our extension on the choice, ``token_ids``,
    ``token_logprobs`` and ``token_versions``, carries what training needs (the OpenAI
    ``logprobs`` field holds strings, not ids)."""
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                              "logprobs": None, "token_ids": completion_ids}  # fmt: skip
    if logprobs is not None:
        choice["token_logprobs"] = logprobs
    if versions is not None:
        choice["token_versions"] = versions
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(completion_ids),
            "total_tokens": prompt_tokens + len(completion_ids),
        },  # fmt: skip
    }
