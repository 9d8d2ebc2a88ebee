"""A search agent written against the OpenAI client shape: multi-hop questions over a generated
corpus with ``search`` and ``open`` tools (:mod:`core.agents.search_env`).

Run it with ``rollout.workflow=core.agents.workflow:OpenAIAgentWorkflow``,
``rollout.agent=core.agents.search_agent:search_agent``, ``data.source=search_synthetic`` and
``rollout.reward_fn=core.rewards.short_answer:exact_match`` (see experiments/agent_search.yaml).
Every tool call waits a latency drawn from ``episode.tool_latency`` and is cut off at its time
limit (:mod:`core.agents.latency`); the model sees a timeout like any tool error. The tools and
their runner live in :mod:`core.agents.search_env`, shared with the SFT episodes.
"""

from __future__ import annotations

from typing import Any

from core.agents.latency import ToolClock, episode_seed
from core.agents.search_env import TOOLS, run_tool, search_index
from core.agents.tool_calls import error_message
from core.agents.workflow import AgentEpisode


async def search_agent(episode: AgentEpisode) -> str:
    """Ask, run the search/open calls, ask again, up to ``max_turns`` completion calls; the last
    reply without calls is the answer."""
    sample = episode.sample
    index = search_index(int(sample["corpus_seed"]), int(sample["corpus_size"]))
    clock = ToolClock(episode.tool_latency, episode_seed(sample))
    messages: list[Any] = list(episode.messages)
    answer = ""
    for _ in range(episode.max_turns):
        reply = await episode.client.chat.completions.create(messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message)
        answer = message.content or ""
        errors = (message.model_extra or {}).get("tool_call_errors") or []
        if not message.tool_calls and not errors:
            break
        for call in message.tool_calls or []:
            name, arguments = call.function.name, call.function.arguments

            def tool(name: str = name, arguments: str = arguments) -> str:
                return run_tool(index, name, arguments)

            content = await clock.call(name, tool)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        messages += [error_message(e) for e in errors]
    episode.info.update(
        tool_calls=clock.n_calls, tool_timeouts=clock.n_timeouts, tool_wait_s=clock.waited_s
    )
    return answer
