"""A small agent written against the OpenAI client shape: arithmetic with a calculator tool.

Run it with ``rollout.workflow=core.agents.workflow:OpenAIAgentWorkflow`` and
``rollout.agent=core.agents.examples:calculator_agent`` (and ``data.prompt_format=chat``).
"""

from __future__ import annotations

import json
from typing import Any

from core.agents.latency import ToolClock, episode_seed
from core.agents.tool_calls import error_message
from core.agents.workflow import AgentEpisode
from core.data.synthetic import CALCULATOR_TOOL
from core.rollout.tools import calculator

CALCULATOR = CALCULATOR_TOOL  # the tool the synthetic solved episodes call (SFT)


def run_calculator(name: str, arguments: str | None) -> str:
    """One tool call's result (errors are results, not raises)."""
    if name != "calc":
        return f"error: unknown tool {name!r}; the tool is calc"
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return "error: calc arguments are not JSON"
    if not isinstance(parsed, dict):
        return "error: calc arguments must be an object"
    return calculator(str(parsed.get("expression", "")))


async def calculator_agent(episode: AgentEpisode) -> str:
    """Ask, run any calculator calls, ask again; the last reply without calls is the answer."""
    messages: list[Any] = list(episode.messages)
    clock = ToolClock(episode.tool_latency, episode_seed(episode.sample))
    answer = ""
    for _ in range(episode.max_turns):
        reply = await episode.client.chat.completions.create(messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message)
        answer = message.content or ""
        errors = (message.model_extra or {}).get("tool_call_errors") or []
        if not message.tool_calls and not errors:
            break
        for call in message.tool_calls or []:
            name, arguments = call.function.name, call.function.arguments
            content = await clock.call(name, lambda n=name, a=arguments: run_calculator(n, a))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        messages += [error_message(e) for e in errors]
    episode.info.update(tool_calls=clock.n_calls, tool_wait_s=clock.waited_s)
    return answer
