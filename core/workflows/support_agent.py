"""A customer-service agent written against the OpenAI client shape, talking to the simulated
customer of :mod:`core.workflows.support_env` (a multi-turn dialogue with tools).

Run it with ``rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow``,
``agent.function=core.workflows.support_agent:serve`` and ``data.source=customer_service`` (see
experiments/customer_service.yaml). Each completion either calls tools (run against the
episode's order desk, with the episode's simulated latency) or speaks to the customer, who
answers or, satisfied, ends the episode. Per-episode metrics (``metric/...`` in the episode's
info: the training batch's ``agent/...`` and the evaluation's metrics) say how it went:
``goal_met``, ``forbidden`` (a forbidden action was taken) and ``looked_up_first`` (the first
tool call was ``lookup_order``).
"""

from __future__ import annotations

from typing import Any

from core.workflows.latency import ToolClock, episode_seed
from core.workflows.openai_agent import AgentEpisode
from core.workflows.support_env import TOOLS, Customer, Desk
from core.workflows.tool_loop import tool_counts, tool_turns


async def serve(episode: AgentEpisode) -> float:
    """Talk to the customer until they are satisfied or ``max_turns`` completions are spent;
    1 for their goal met without a forbidden action, else 0."""
    desk = Desk.from_json(episode.sample["answer"])
    customer = Customer(desk)
    clock = ToolClock(episode.tool_latency, episode_seed(episode.sample))
    messages: list[Any] = list(episode.messages)
    # [] with data.customer_service.show_tools=false
    tools = episode.sample.get("tools", TOOLS) or None
    said = ""
    for _ in range(episode.max_turns):
        reply = await episode.client.chat.completions.create(messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message)
        turns = await tool_turns(message, clock, desk.run_tool)
        if turns:
            messages += turns
            continue
        said = message.content or ""
        answer = customer.answer(said)
        if answer is None:
            break
        messages.append({"role": "user", "content": answer})
    episode.info.update(
        **tool_counts(clock),
        completion=said, outcome="; ".join(desk.forbidden) or ("met" if customer.satisfied else "unmet"),
        **{"metric/goal_met": float(customer.satisfied),
           "metric/forbidden": float(bool(desk.forbidden)),
           "metric/looked_up_first": float(desk.calls[:1] == ["lookup_order"])},
    )  # fmt: skip
    return customer.reward()
