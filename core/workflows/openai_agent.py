"""Agent code as a rollout workflow: ``rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow``.

``agent.function`` names an async function (``"package.module:function"``) that plays one episode::

    async def my_agent(episode: AgentEpisode) -> float | str | None:
        messages = episode.messages          # system (data.system_prompt) + the user's question
        reply = await episode.client.chat.completions.create(messages=messages, tools=TOOLS)
        ...
        return reply.choices[0].message.content   # a final answer: rollout.reward_fn scores it

``episode.client`` has the OpenAI SDK's ``chat.completions.create`` shape
(:class:`~core.workflows.openai_client.AgentChatClient`), backed by the run's engine; the
conversation becomes one trajectory, model tokens trained, or with
``agent.trajectory_mode=per_turn`` each call becomes its own (they share the episode's reward). The agent returns its final answer
(a string, scored against ``sample["answer"]`` by ``rollout.reward_fn``), a reward (a number),
or None to reject the episode. An agent in another process uses the server's
``/v1/chat/completions`` instead (:mod:`core.inference.server.chat_endpoint`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from core.data.prompting import Prompter
from core.inference.api import InferenceEngine, SamplingParams
from core.plugins import load_object
from core.rewards.verifier_pool import Scorer, scorer_from_config
from core.rollout.api import Trajectory
from core.sandbox import SandboxLimits
from core.workflows.latency import LatencySpec
from core.workflows.openai_client import AgentChatClient


@dataclass
class AgentEpisode:
    """What agent code gets for one episode."""

    client: AgentChatClient  # client.chat.completions.create(messages=..., tools=...)
    sample: dict[str, Any]  # the dataset row: "question", "answer", maybe "system", "seed"
    messages: list[dict[str, Any]]  # the opening conversation, rendered as the run's prompts are
    max_turns: int  # agent.max_turns: the most completion calls the agent should make
    # tools.latency_s/latency_p99_s/timeout_s: its tools' latency draws and per-call limit
    # (run them through core.workflows.latency.ToolClock)
    tool_latency: LatencySpec = field(default_factory=LatencySpec)
    info: dict[str, Any] = field(default_factory=dict)  # the agent's notes -> trajectory metadata
    # tools.timeout_s/sandbox: the limits of tools that run model-written code in the
    # sandbox (core.sandbox: run_python, run_bash)
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)


TRAJECTORY_MODES = ("conversation", "per_turn")

AgentFn = Callable[[AgentEpisode], Awaitable[float | str | None]]


def load_agent(path: str) -> AgentFn:
    """The agent function named by ``agent.function``, checked to be a coroutine function."""
    if not path:
        raise ValueError(
            "needs an agent, e.g. agent.function=core.workflows.examples:calculator_agent"
        )
    agent = load_object(path, "agent")
    if not inspect.iscoroutinefunction(agent):
        raise ValueError(f"agent {path!r} must be an async function taking an AgentEpisode")
    return agent


class OpenAIAgentWorkflow:
    """Runs ``agent.function`` once per episode with an OpenAI-shaped client (see module doc)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        agent: AgentFn,
        sampling: SamplingParams,
        *,
        score: Scorer,
        prompter: Prompter,
        max_turns: int = 4,
        tool_latency: LatencySpec | None = None,
        trajectory_mode: str = "conversation",
        sandbox: SandboxLimits | None = None,
    ) -> None:
        if prompter.prompt_format != "chat":
            raise ValueError("the agent workflow speaks chat: set data.prompt_format=chat")
        self.tokenizer = tokenizer
        self.agent = agent
        self.sampling = sampling
        self.score = score
        self.prompter = prompter
        self.max_turns = max_turns
        self.tool_latency = tool_latency or LatencySpec()
        self.sandbox = sandbox or SandboxLimits()
        if trajectory_mode not in TRAJECTORY_MODES:
            raise ValueError(
                f"agent.trajectory_mode={trajectory_mode!r}: expected one of {TRAJECTORY_MODES}"
            )
        self.per_turn = trajectory_mode == "per_turn"

    @classmethod
    def from_config(cls, config: Any, tokenizer: PreTrainedTokenizerBase) -> OpenAIAgentWorkflow:
        t = config.tools
        return cls(
            tokenizer,
            load_agent(config.agent.function),
            SamplingParams.of(config.sampling),
            score=scorer_from_config(config),
            prompter=Prompter.from_config(config, tokenizer),
            max_turns=config.agent.max_turns,
            tool_latency=LatencySpec(t.latency_s, t.latency_p99_s, t.timeout_s),
            trajectory_mode=config.agent.trajectory_mode,
            sandbox=SandboxLimits(wall_time_s=t.timeout_s, isolation=t.sandbox),
        )

    def close(self) -> None:
        self.score.close()

    def opening(self, sample: dict[str, Any]) -> list[dict[str, Any]]:
        """System prompt (the sample's own, else data.system_prompt) and the user's question."""
        return self.prompter.opening(sample["question"], sample.get("system"))

    async def run_episode(
        self, engine: InferenceEngine, sample: dict[str, Any]
    ) -> list[Trajectory] | None:
        started = time.monotonic()
        client = AgentChatClient(engine, self.tokenizer, self.sampling, seed=sample.get("seed"))
        episode = AgentEpisode(client, sample, self.opening(sample), self.max_turns,
                               self.tool_latency, sandbox=self.sandbox)  # fmt: skip
        result = await self.agent(episode)
        if result is None:
            return None
        if isinstance(result, str):
            reward = await self.score(result, sample["answer"])
            episode.info.setdefault("completion", result)
        else:  # the agent scored it: rollout.reward_fn (and its eval metrics) had no say
            reward = float(result)
            episode.info.setdefault("scored_by", "agent")
        info = {"episode_seconds": time.monotonic() - started, **episode.info}
        return client.trajectories(reward, self.per_turn, **info)
