"""An OpenAI-shaped chat client for agent code, backed by the run's inference engine.

Agent code written against ``openai.AsyncOpenAI`` runs unchanged on it::

    reply = await client.chat.completions.create(messages=messages, tools=TOOLS)
    message = reply.choices[0].message          # the SDK's own ChatCompletionMessage
    messages.append(message)
    for call in message.tool_calls or []: ...

Every call renders ``messages`` with the chat template, samples from the engine (resuming across
weight updates like every workflow) and records the prompt and completion token ids, the
behaviour log-probs and the weight version of each token. :meth:`AgentChatClient.trajectories`
turns the episode into :class:`~core.rollout.api.Trajectory` rows: model tokens trained, every
other token (prompt, tool results, user turns) context only.

``conversation`` (the default): one trajectory per conversation. Each call's conversation must
continue the previous one (the earlier messages, then the assistant reply this client returned,
then new tool/user messages); the new messages' tokens are appended after the sampled tokens, so
the trajectory holds exactly the tokens the model was conditioned on and produced, never a
re-tokenisation of its output. A call whose history was rewritten (messages dropped or edited,
as agents that summarise or trim their context do) starts a new trajectory from that call;
the earlier one is kept and trained too, and ``metadata["restarts"]`` counts them.

``per_turn``: one trajectory per call, its prompt (context) and its completion (trained), as
AReaL-lite's "individual" mode. It trains the same tokens on the same context as a continuous
conversation but costs a forward pass over each call's whole prompt.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from transformers import PreTrainedTokenizerBase

from core.agents.chat import (
    assistant_message,
    completion_body,
    finish_reason,
    normalize_message,
    normalize_messages,
    render,
)
from core.agents.tool_calls import parse_tool_calls
from core.data.prompting import end_of_turn_ids
from core.inference.api import GenerationRequest, InferenceEngine, SamplingParams, generate_resuming
from core.rollout.api import Trajectory, derive_seed

logger = logging.getLogger(__name__)


@dataclass
class _Tokens:
    """The episode's token sequence so far, with the per-token training data."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        """Tokens before the first generated one."""
        return self.mask.index(1) if 1 in self.mask else len(self.ids)

    def context(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def generated(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += versions


class AgentChatClient:
    """``client.chat.completions.create(...)`` over an :class:`InferenceEngine` (see module doc)."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingParams,
        *,
        seed: int | None = None,
        model: str = "policy",
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.seed = seed
        self.model = model
        self.session = uuid.uuid4().hex  # the episode's calls go to one server (its KV cache)
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        self._turn_end = end_of_turn_ids(tokenizer)
        self._tokens = _Tokens()  # the conversation going on
        self._finished: list[_Tokens] = []  # conversations the agent rewrote: trained too
        self._calls: list[_Tokens] = []  # each call's prompt and completion (per_turn)
        self._history: list[dict[str, Any]] = []  # the last call's messages + its reply
        self._tools: list[dict[str, Any]] | None = None
        self.n_calls = 0
        self.restarts = 0
        self.completion_tokens = 0
        self.n_resumes = 0  # weight updates that interrupted the episode's calls

    async def create(
        self,
        *,
        messages: list[Any],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: list[str] | str | None = None,
        **_: Any,
    ) -> Any:
        """One chat completion (the OpenAI SDK's arguments that matter here; ``model`` and the
        rest are accepted and ignored). Returns ``openai.types.chat.ChatCompletion``."""
        from openai.types.chat import ChatCompletion  # the SDK's own types, not a look-alike

        normalized = normalize_messages(messages)
        prompt_ids = self._prompt_ids(normalized, tools)
        sampling = dataclasses.replace(
            self.sampling,
            max_new_tokens=max_completion_tokens or max_tokens or self.sampling.max_new_tokens,
            temperature=self.sampling.temperature if temperature is None else temperature,
            top_p=self.sampling.top_p if top_p is None else top_p,
            stop=[stop] if isinstance(stop, str) else list(stop or self.sampling.stop),
            stop_token_ids=list(dict.fromkeys([*self.sampling.stop_token_ids, *self._turn_end])),
            seed=None if self.seed is None else derive_seed(self.seed, self.n_calls),
        )
        request = GenerationRequest(prompt_ids, sampling, session=self.session)
        response = await generate_resuming(self.engine, request)
        self.n_calls += 1
        self.completion_tokens += len(response.output_ids)
        self.n_resumes += response.n_resumes
        self._tokens.generated(response.output_ids, response.logprobs, response.versions)
        call = _Tokens()
        call.context(prompt_ids)
        call.generated(response.output_ids, response.logprobs, response.versions)
        self._calls.append(call)
        text = self.tokenizer.decode(response.output_ids, skip_special_tokens=True)
        turn = parse_tool_calls(text)
        message = assistant_message(turn)
        self._history = [*normalized, normalize_message(message)]
        self._tools = tools
        body = completion_body(
            model=self.model, message=message, finish=finish_reason(turn, response.stop_reason),
            prompt_tokens=len(prompt_ids), completion_ids=response.output_ids,
            logprobs=response.logprobs, versions=response.versions,
        )  # fmt: skip
        return ChatCompletion.model_validate(body)

    def _prompt_ids(self, messages: list[dict[str, Any]], tools: Any) -> list[int]:
        """The ids to generate from; appends the context tokens to the episode's sequence."""
        n = len(self._history)
        continues = bool(n) and tools == self._tools and _same(messages[:n], self._history)
        if continues:
            bridge = self._bridge(messages, tools)
            if bridge is not None:
                self._tokens.context(bridge)
                return list(self._tokens.ids)
        if n:
            self.restarts += 1
            logger.debug(
                "agent rewrote its history: a new trajectory starts at call %d", self.n_calls
            )
            self._finished.append(self._tokens)
        ids = self._encode(render(self.tokenizer, messages, tools))
        self._tokens = _Tokens()
        self._tokens.context(ids)
        return ids

    def _bridge(self, messages: list[dict[str, Any]], tools: Any) -> list[int] | None:
        """Tokens between the last sampled token and the next generation prompt: the end of the
        assistant turn if sampling stopped short of it, what the template writes after the turn,
        the new messages and the generation prompt. None if the template is not prefix-stable."""
        closed = render(self.tokenizer, self._history, tools, add_generation_prompt=False)
        full = render(self.tokenizer, messages, tools)
        if not full.startswith(closed):
            return None
        ids: list[int] = []
        last = self._tokens.ids[-1] if self._tokens.mask and self._tokens.mask[-1] else None
        if last not in self._turn_end and self._turn_end:
            ids.append(self._turn_end[0])  # cut by max_tokens: close the turn as the template does
        end = self.tokenizer.decode([self._turn_end[0]]) if self._turn_end else ""
        after_turn = closed[closed.rfind(end) + len(end) :] if end and end in closed else ""
        return ids + self._encode(after_turn + full[len(closed) :])

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def trajectories(
        self, reward: float, per_turn: bool = False, /, **metadata: Any
    ) -> list[Trajectory]:
        """The episode's rows with ``reward`` (see the module doc): its conversations, or with
        ``per_turn`` its calls. Every row gets ``metadata`` and the episode's call counts. A row
        with no generated token (a conversation whose next call failed, an empty completion)
        trains nothing and is left out, unless it is the only one."""
        if not self.n_calls:
            raise ValueError("the agent made no chat completion call: nothing to train on")
        parts = self._calls if per_turn else [*self._finished, self._tokens]
        parts = [t for t in parts if 1 in t.mask] or parts[-1:]
        info = {
            "turns": self.n_calls, "restarts": self.restarts, "n_resumes": self.n_resumes,
            **metadata,
        }  # fmt: skip
        return [
            Trajectory(input_ids=list(t.ids), loss_mask=list(t.mask), logprobs=list(t.logprobs),
                       versions=list(t.versions), reward=float(reward), prompt_len=t.prompt_len,
                       metadata=dict(info))
            for t in parts
        ]  # fmt: skip


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Messages equal as a template sees them (tool-call ids aside)."""

    def key(m: dict[str, Any]) -> tuple:
        calls = [
            (c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls", [])
        ]
        return (m["role"], m.get("content", ""), repr(calls), m.get("name"))

    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b, strict=True))
