"""A small agent written against the OpenAI client shape: arithmetic with a calculator tool.

Run it with ``rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow`` and
``agent.function=core.workflows.examples:calculator_agent`` (and ``data.prompt_format=chat``).
"""

from __future__ import annotations

from core.data.synthetic import CALCULATOR_TOOL
from core.inference.tool_calls import tool_arguments
from core.workflows.openai_agent import AgentEpisode
from core.workflows.tool_loop import tool_loop
from core.workflows.tools import calculator

CALCULATOR = CALCULATOR_TOOL  # the tool the synthetic solved episodes call (SFT)


def run_calculator(name: str, arguments: str | None) -> str:
    """One tool call's result (errors are results, not raises)."""
    if name != "calc":
        return f"error: unknown tool {name!r}; the tool is calc"
    parsed = tool_arguments(name, arguments)
    if isinstance(parsed, str):
        return parsed
    return calculator(str(parsed.get("expression", "")))


async def calculator_agent(episode: AgentEpisode) -> str:
    """Ask, run any calculator calls, ask again; the last reply without calls is the answer."""
    return await tool_loop(episode, [CALCULATOR], run_calculator)
