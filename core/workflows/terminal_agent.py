"""A terminal agent written against the OpenAI client shape: it answers questions about an
episode's files, and does chores on them, with one tool, ``bash`` (real bash in the sandbox:
:func:`core.sandbox.run_bash`), over the tasks of :mod:`core.workflows.terminal_env`.

Run it with ``rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow``,
``agent.function=core.workflows.terminal_agent:serve`` and ``data.source=terminal`` (see
experiments/terminal.yaml). The files persist between the episode's calls (a ``mv`` in one is
seen by the next); each call runs under ``tools.timeout_s`` and ``tools.sandbox``.
Per-episode metrics (``metric/...``: the training batch's ``agent/...`` and the evaluation's
metrics): ``used_bash`` (the agent ran a command before answering) and ``nonzero_exit``
(one of its commands exited non-zero or did not finish; ``grep`` exits 1 when nothing
matched).
"""

from __future__ import annotations

from core.inference.tool_calls import tool_arguments
from core.sandbox import run_bash
from core.workflows.openai_agent import AgentEpisode
from core.workflows.terminal_data import TOOLS
from core.workflows.terminal_env import TerminalTask
from core.workflows.tool_loop import tool_loop


async def serve(episode: AgentEpisode) -> float:
    """Run the tool loop over the episode's files; 1 when the task is done, else 0."""
    task = TerminalTask.from_json(episode.sample["answer"])
    files = dict(task.files)
    failed = []

    async def run_tool(name: str, arguments: str | None) -> str:
        parsed = tool_arguments(name, arguments)
        if isinstance(parsed, str):
            return parsed
        if name != "bash":
            return f"error: unknown tool {name!r}; the tool is bash"
        result = await run_bash(str(parsed.get("command", "")), files, episode.sandbox)
        files.clear()
        files.update(result.files)
        failed.append(result.exit_code != 0)
        return result.for_model()

    tools = episode.sample.get("tools", TOOLS) or None  # [] with data.terminal.show_tools=false
    reply = await tool_loop(episode, tools, run_tool)
    solved = task.solved(files, reply)
    episode.info.update(
        completion=reply,
        **{"metric/solved": float(solved),
           "metric/used_bash": float(episode.info.get("tool_calls", 0) > 0),
           "metric/nonzero_exit": float(any(failed))},
    )  # fmt: skip
    return float(solved)
