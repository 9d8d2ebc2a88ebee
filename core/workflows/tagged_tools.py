"""Multi-turn tool agent: the model writes tool calls, the environment answers, reward at the end.

One episode alternates model turns and tool results in a single token sequence::

    prompt | model: "... <calc>7-2</calc>" | tool: "<result>5</result>" | model: "... #### 15"

Model tokens are trained on (``loss_mask`` 1, behaviour logprobs and versions kept); prompt and
tool-result tokens are context only (mask 0). Each model turn stops at the first complete tool
call: early when the closing tag is a single token (our tokenizers add the tags as tokens), else
by cutting the turn's tokens right after the call, so nothing sampled "past" a call is trained on.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from core.data.prompting import Prompter
from core.inference.api import GenerationRequest, InferenceEngine, SamplingParams, generate_resuming
from core.inference.stop_strings import cut_response
from core.rewards.verifier_pool import Scorer, make_scorer, scorer_from_config
from core.rollout.api import Trajectory
from core.sandbox import SandboxLimits
from core.workflows.tools import STOP_STRINGS, ToolBox, ToolCall, find_tool_call

_RESULT = re.compile(r"<result>.*?</result>", re.DOTALL)


class ToolAgentWorkflow:
    """Up to ``max_turns`` model turns with tool calls in between; outcome reward on the answer."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        reward_fn: str | Callable[[str, str], float],
        sampling: SamplingParams,
        *,
        toolbox: ToolBox,
        prompter: Prompter | None = None,
        max_turns: int = 4,
        score: Scorer | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.score = score or make_scorer(reward_fn)
        self.toolbox = toolbox
        self.prompter = prompter or Prompter(tokenizer)
        self.max_turns = max_turns
        stops = [*sampling.stop_token_ids, *self.prompter.stop_ids]
        # A closing tag that is one token lets the engine stop right at the call.
        for tag in STOP_STRINGS:
            ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
            if len(ids) == 1:
                stops.append(ids[0])
        strings = list(dict.fromkeys([*sampling.stop, *self.prompter.stop_strings]))
        self.sampling = dataclasses.replace(
            sampling, stop_token_ids=list(dict.fromkeys(stops)), stop=strings
        )

    @classmethod
    def from_config(cls, config: Any, tokenizer: PreTrainedTokenizerBase) -> ToolAgentWorkflow:
        t = config.tools
        limits = SandboxLimits(wall_time_s=t.timeout_s, isolation=t.sandbox)
        toolbox = ToolBox(limits, latency_s=t.latency_s)
        sampling = SamplingParams.of(config.sampling)
        return cls(
            tokenizer,
            config.rollout.reward_fn,
            sampling,
            toolbox=toolbox,
            prompter=Prompter.from_config(config, tokenizer),
            max_turns=config.agent.max_turns,
            score=scorer_from_config(config),
        )

    def close(self) -> None:
        """Stop the reward's verifier processes, if any."""
        self.score.close()

    async def run_episode(self, engine: InferenceEngine, sample: dict[str, Any]) -> Trajectory:
        started = time.monotonic()
        prompt = self.prompter.prompt_ids(sample["question"], sample.get("system"))
        ids, mask, logprobs, versions = (
            list(prompt),
            [0] * len(prompt),
            [0.0] * len(prompt),
            [-1] * len(prompt),
        )
        budget = self.sampling.max_new_tokens
        turns, tool_seconds, n_resumes, stop_reason = 0, 0.0, 0, "length"
        session = uuid.uuid4().hex  # every turn on one server: its prefix cache has the rest
        while turns < self.max_turns and budget > 0:
            turns += 1
            sampling = dataclasses.replace(
                self.sampling, max_new_tokens=budget, seed=sample.get("seed")
            )
            response = cut_response(
                self.tokenizer,
                await generate_resuming(engine, GenerationRequest(ids, sampling, session=session)),
                sampling.stop,
            )
            n_resumes += response.n_resumes
            out, call = self._cut_at_call(response.output_ids)
            ids += out
            mask += [1] * len(out)
            logprobs += response.logprobs[: len(out)]
            versions += response.versions[: len(out)]
            budget -= len(out)
            stop_reason = response.stop_reason
            if call is None:
                break
            t = time.monotonic()
            result = await self.toolbox.call(call)
            tool_seconds += time.monotonic() - t
            result_ids = self.tokenizer(result, add_special_tokens=False)["input_ids"]
            ids += result_ids
            mask += [0] * len(result_ids)
            logprobs += [0.0] * len(result_ids)
            versions += [-1] * len(result_ids)
        transcript = self.tokenizer.decode(ids[len(prompt) :], skip_special_tokens=True)
        reward = await self.score(_RESULT.sub("", transcript), sample["answer"])
        return Trajectory(
            input_ids=ids,
            loss_mask=mask,
            logprobs=logprobs,
            versions=versions,
            reward=reward,
            prompt_len=len(prompt),
            metadata={
                "completion": transcript,
                "turns": turns,
                "stop_reason": stop_reason,
                "n_resumes": n_resumes,
                "tool_seconds": tool_seconds,
                "episode_seconds": time.monotonic() - started,
            },
        )

    def _cut_at_call(self, output_ids: list[int]) -> tuple[list[int], ToolCall | None]:
        """The turn's tokens up to and including its first complete tool call, and that call."""
        text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        call = find_tool_call(text)
        if call is None:
            return output_ids, None
        # The shortest token prefix whose text already holds the whole call.
        for k in range(1, len(output_ids) + 1):
            prefix = self.tokenizer.decode(output_ids[:k], skip_special_tokens=True)
            if len(prefix) >= call.end and find_tool_call(prefix) is not None:
                return output_ids[:k], call
        return output_ids, call
