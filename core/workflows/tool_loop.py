"""The loop most tool agents run, written against the OpenAI client shape.

Ask with the tools; run each tool call the reply makes (with the episode's simulated latency and
per-call time limit, :mod:`core.workflows.latency`); answer malformed calls with an error turn;
ask again. It stops at a reply without calls, or after ``episode.max_turns`` completions, and
returns that reply's text as the final answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.inference.tool_calls import error_message
from core.workflows.latency import ToolClock, episode_seed
from core.workflows.openai_agent import AgentEpisode

RunTool = Callable[[str, str | None], str]  # (name, JSON arguments) -> the result text


async def tool_loop(episode: AgentEpisode, tools: list[dict[str, Any]], run_tool: RunTool) -> str:
    """Run the loop above; tool counts and waiting time go to ``episode.info``."""
    clock = ToolClock(episode.tool_latency, episode_seed(episode.sample))
    messages: list[Any] = list(episode.messages)
    answer = ""
    for _ in range(episode.max_turns):
        reply = await episode.client.chat.completions.create(messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message)
        answer = message.content or ""
        errors = (message.model_extra or {}).get("tool_call_errors") or []
        if not message.tool_calls and not errors:
            break
        for call in message.tool_calls or []:
            name, arguments = call.function.name, call.function.arguments
            content = await clock.call(name, lambda n=name, a=arguments: run_tool(n, a))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        messages += [error_message(e) for e in errors]
    episode.info.update(
        tool_calls=clock.n_calls, tool_timeouts=clock.n_timeouts, tool_wait_s=clock.waited_s
    )
    return answer
