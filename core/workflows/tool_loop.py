"""The loop most tool agents run, written against the OpenAI client shape.

Ask with the tools; run each tool call the reply makes (with the episode's simulated latency and
per-call time limit, :mod:`core.workflows.latency`); answer malformed calls with an error turn;
ask again. It stops at a reply without calls, or after ``episode.max_turns`` completions, and
returns that reply's text as the final answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from core.inference.tool_calls import error_message
from core.workflows.latency import ToolClock, episode_seed
from core.workflows.openai_agent import AgentEpisode

# (name, JSON arguments) -> the result text, or a coroutine of it
RunTool = Callable[[str, str | None], str | Awaitable[str]]


async def tool_turns(message: Any, clock: ToolClock, run_tool: RunTool) -> list[dict[str, Any]]:
    """The turns answering a reply's tool calls: each call's result (run through ``clock``), then
    an error turn per malformed call; [] for a reply that made no call."""
    turns = []
    for call in message.tool_calls or []:
        name, arguments = call.function.name, call.function.arguments
        content = await clock.call(name, lambda n=name, a=arguments: run_tool(n, a))
        turns.append({"role": "tool", "tool_call_id": call.id, "content": content})
    errors = (message.model_extra or {}).get("tool_call_errors") or []
    return turns + [error_message(e) for e in errors]


def tool_counts(clock: ToolClock) -> dict[str, Any]:
    """What an episode's info records of its tool calls."""
    return {"tool_calls": clock.n_calls, "tool_timeouts": clock.n_timeouts,
            "tool_wait_s": clock.waited_s}  # fmt: skip


async def tool_loop(
    episode: AgentEpisode, tools: list[dict[str, Any]] | None, run_tool: RunTool
) -> str:
    """Run the loop above; tool counts and waiting time go to ``episode.info``."""
    clock = ToolClock(episode.tool_latency, episode_seed(episode.sample))
    messages: list[Any] = list(episode.messages)
    answer = ""
    for _ in range(episode.max_turns):
        reply = await episode.client.chat.completions.create(messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message)
        answer = message.content or ""
        turns = await tool_turns(message, clock, run_tool)
        if not turns:
            break
        messages += turns
    episode.info.update(tool_counts(clock))
    return answer
