"""``POST /v1/chat/completions``: the OpenAI chat API on our engine, for agents in other processes.

Agent code in another process or framework points the real ``openai`` package at the server
(``OpenAI(base_url="http://host:port/v1", api_key=...)``) and gets what the in-process client
(:mod:`core.workflows.openai_client`) returns: the messages rendered with the model's chat template
(tools included), the reply split into content and ``tool_calls`` (Hermes/Qwen
``<tool_call>`` JSON; malformed calls listed in ``message.tool_call_errors``), ``usage``, and on
the choice our extension for training, ``token_ids``, ``token_logprobs`` and ``token_versions``.

Supported: ``messages``, ``tools``, ``max_tokens``/``max_completion_tokens``, ``temperature``,
``top_p``, ``stop``, ``seed``. Refused with a 400 naming the field: ``stream=true``, ``n`` other
than 1, anything else unknown to the OpenAI API. Generation ends at the template's end-of-turn
token. Needs a server whose model folder has a tokenizer with a chat template.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from core.inference.api import GenerationRequest
from core.inference.chat import (
    assistant_message,
    completion_body,
    finish_reason,
    normalize_messages,
    render,
)
from core.inference.engine.hf_engine import HFEngine
from core.inference.server.sglang_params import parse_sampling
from core.inference.server.validation import RequestError, RequestLimits
from core.inference.tool_calls import parse_tool_calls
from core.models.chat_template import end_of_turn_ids

# OpenAI chat-completion fields we accept; those we do not act on are harmless hints.
_USED = {"messages", "tools", "max_tokens", "max_completion_tokens", "temperature", "top_p",
         "stop", "seed", "stream", "n"}  # fmt: skip
_IGNORED = {"model", "tool_choice", "parallel_tool_calls", "user", "metadata", "store",
            "logprobs", "top_logprobs", "stream_options", "service_tier"}  # fmt: skip
_OUR_NAMES = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}


def parse_chat(body: Any, limits: RequestLimits) -> dict[str, Any]:
    """The body as a dict with only known fields, streaming and ``n`` refused, its size and text
    checked before anything is rendered or tokenised."""
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    unknown = sorted(set(body) - _USED - _IGNORED)
    if unknown:
        raise RequestError(unknown[0], "is not a chat-completions field this server supports")
    if body.get("stream"):
        raise RequestError("stream", "streaming is not supported: send stream=false")
    if body.get("n", 1) != 1:
        raise RequestError("n", "only n=1 is supported")
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise RequestError("tools", "must be a list of tool objects")
    _check_size(body, limits)
    try:
        body = {**body, "messages": normalize_messages(body.get("messages"))}
    except ValueError as err:
        raise RequestError("messages", str(err)) from None
    return body


def _check_size(body: dict[str, Any], limits: RequestLimits) -> None:
    """Too many messages, too much text, or a string that is not Unicode (a lone surrogate,
    which JSON can spell as ``\\ud800``), named by field."""
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise RequestError(
            "messages", f"{len(messages)} messages; this server takes at most {limits.max_messages}"
        )
    budget = limits.chat_chars()
    total = 0
    for field, text in _strings({"messages": messages, "tools": body.get("tools")}):
        total += len(text)
        if total > budget:
            raise RequestError(
                field.split("[")[0],
                f"over {budget} characters of text; this server's context is "
                f"{limits.context_length or 'unbounded'} tokens",
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RequestError(
                field, f"is not valid Unicode (a lone surrogate at {err.start})"
            ) from None


def _strings(value: Any, field: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a JSON value (dict keys included), with where it is, in order (the size
    check stops at the first string over the budget)."""
    if isinstance(value, str):
        yield field, value
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{field}.{key}" if field else str(key)
            yield path, str(key)
            yield from _strings(item, path)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _strings(item, f"{field}[{i}]")


async def chat_completion(
    engine: HFEngine, limits: RequestLimits, body: dict[str, Any], model: str
) -> dict[str, Any]:
    """Answer a :func:`parse_chat`-checked body with an OpenAI ``chat.completion`` body."""
    tokenizer = engine.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise RequestError("model", "this server's model has no tokenizer with a chat template")
    text = render(tokenizer, body["messages"], body.get("tools"))
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if limits.context_length is not None and len(ids) >= limits.context_length:
        raise RequestError(
            "messages",
            f"the rendered conversation is {len(ids)} tokens; this model's context is "
            f"{limits.context_length}",
        )
    raw = {"max_new_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
           "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
           "stop": body.get("stop"), "sampling_seed": body.get("seed"),
           "stop_token_ids": end_of_turn_ids(tokenizer)}  # fmt: skip
    try:
        sampling = parse_sampling(raw, len(ids), limits, "body")
    except RequestError as err:
        name = err.field.removeprefix("body.")
        raise RequestError(_OUR_NAMES.get(name, name), str(err).split(": ", 1)[-1]) from None
    try:
        response = await engine.agenerate(GenerationRequest(ids, sampling))
    except ValueError as err:  # the engine's own checks (e.g. the rendered prompt's length)
        raise RequestError("messages", str(err)) from None
    turn = parse_tool_calls(tokenizer.decode(response.output_ids, skip_special_tokens=True))
    return completion_body(
        model=str(body.get("model") or model), message=assistant_message(turn),
        finish=finish_reason(turn, response.stop_reason), prompt_tokens=len(ids),
        completion_ids=response.output_ids, logprobs=response.logprobs,
        versions=response.versions,
    )  # fmt: skip
