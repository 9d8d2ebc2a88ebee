"""Single-turn RL with verifiable rewards (RLVR): one completion per episode, scored by a checker."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerBase

from core.data.prompting import Prompter
from core.inference.api import GenerationRequest, InferenceEngine, SamplingParams, generate_resuming
from core.inference.stop_strings import cut_response
from core.rewards.reward_model import RewardModelScorer, reward_model_from_config
from core.rewards.verifier_pool import Scorer, make_scorer, scorer_from_config
from core.rollout.api import Trajectory


class RLVRWorkflow:
    """Prompt → one sampled completion → reward(completion, reference answer)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        reward_fn: str | Callable[[str, str], float],
        sampling: SamplingParams,
        prompter: Prompter | None = None,
        score: Scorer | None = None,
        reward_model: RewardModelScorer | None = None,
        reward_coefs: tuple[float, float] = (1.0, 0.0),
    ) -> None:
        self.tokenizer = tokenizer
        self.score = score or make_scorer(reward_fn)
        # With a reward model: reward = coefs[0] × its score + coefs[1] × the task's reward.
        self.reward_model = reward_model
        self.reward_coefs = reward_coefs
        self.prompter = prompter or Prompter(tokenizer)
        stops = list(dict.fromkeys([*sampling.stop_token_ids, *self.prompter.stop_ids]))
        strings = list(dict.fromkeys([*sampling.stop, *self.prompter.stop_strings]))
        self.sampling = dataclasses.replace(sampling, stop_token_ids=stops, stop=strings)

    @classmethod
    def from_config(cls, config: Any, tokenizer: PreTrainedTokenizerBase) -> RLVRWorkflow:
        """Build from a :class:`core.config.Config` (the ``rollout`` and ``data`` sections)."""
        r = config.rollout
        sampling = SamplingParams.of(config.sampling)
        prompter = Prompter.from_config(config, tokenizer)
        rm = config.reward_model
        return cls(tokenizer, r.reward_fn, sampling, prompter, scorer_from_config(config),
                   reward_model_from_config(config), (rm.coef, rm.task_coef))  # fmt: skip

    def prompt_ids(self, sample: dict[str, Any]) -> list[int]:
        return self.prompter.prompt_ids(sample["question"], sample.get("system"))

    def close(self) -> None:
        """Stop the reward's verifier processes, if any."""
        self.score.close()

    async def run_episode(self, engine: InferenceEngine, sample: dict[str, Any]) -> Trajectory:
        started = time.monotonic()
        prompt = self.prompt_ids(sample)
        sampling = dataclasses.replace(self.sampling, seed=sample.get("seed"))
        response = cut_response(
            self.tokenizer,
            await generate_resuming(engine, GenerationRequest(prompt, sampling)),
            sampling.stop,
        )
        completion = self.tokenizer.decode(response.output_ids, skip_special_tokens=True)
        reward = await self.score(completion, sample["answer"])
        scores: dict[str, float] = {}
        if self.reward_model is not None:  # the task reward stays what evaluation reports
            learned = await self.reward_model(prompt + response.output_ids)
            scores = {"metric/task_reward": reward, "metric/reward_model": learned}
            reward = self.reward_coefs[0] * learned + self.reward_coefs[1] * reward
        n = len(response.output_ids)
        return Trajectory(
            input_ids=prompt + response.output_ids,
            loss_mask=[0] * len(prompt) + [1] * n,
            logprobs=[0.0] * len(prompt) + response.logprobs,
            versions=[-1] * len(prompt) + response.versions,
            reward=reward,
            prompt_len=len(prompt),
            metadata={
                "completion": completion,
                "stop_reason": response.stop_reason,
                "n_resumes": response.n_resumes,
                "turns": 1,
                "episode_seconds": time.monotonic() - started,
                **scores,
            },
        )
