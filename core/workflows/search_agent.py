"""A search agent written against the OpenAI client shape: multi-hop questions over a generated
corpus with ``search`` and ``open`` tools (:mod:`core.workflows.search_env`).

Run it with ``rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow``,
``agent.function=core.workflows.search_agent:search_agent``, ``data.source=search_synthetic`` and
``rollout.reward_fn=core.rewards.short_answer:exact_match`` (see experiments/agent_search.yaml).
The loop is :func:`core.workflows.tool_loop.tool_loop`: every tool call waits a latency drawn from
``episode.tool_latency`` and is cut off at its time limit (:mod:`core.workflows.latency`); the model
sees a timeout like any tool error. The tools and
their runner live in :mod:`core.workflows.search_env`, shared with the SFT episodes.
"""

from __future__ import annotations

import functools

from core.workflows.openai_agent import AgentEpisode
from core.workflows.search_env import TOOLS, run_tool, sample_index
from core.workflows.tool_loop import tool_loop


async def search_agent(episode: AgentEpisode) -> str:
    """Ask, run the search/open calls, ask again, up to ``max_turns`` completion calls; the last
    reply without calls is the answer."""
    index = sample_index(episode.sample)
    return await tool_loop(episode, TOOLS, functools.partial(run_tool, index))
