"""Held-out evaluation: batched greedy generation and the task reward.

Greedy accuracy on a few hundred problems is noisy (±3.5 points at n=200) and which answer style
greedy picks is close to a coin flip early on, so alongside accuracy we report its standard error
and the share of answer-only completions (the behaviour RL is expected to change).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from core.data.templates import render_prompt
from core.rewards.gsm8k import is_direct_answer
from core.rewards.registry import SafeReward

logger = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Accuracy on ``n`` held-out problems, with a few examples to eyeball."""

    n: int
    accuracy: float
    stderr: float
    direct_share: float
    mean_new_tokens: float
    reward_failures: int
    examples: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def generate_greedy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[list[str], list[int]]:
    """Greedy completions for ``prompts`` (left-padded batches, KV cache), decoded without specials,
    and the number of tokens each generated (up to and including eos)."""
    completions: list[str] = []
    lengths: list[int] = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start : start + batch_size])
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(model.device) for k, v in enc.items()}
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        new_tokens = out[:, enc["input_ids"].shape[1] :]
        completions.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
        # generate() pads finished rows with pad tokens; eos itself counts as generated
        lengths.extend((new_tokens != tokenizer.pad_token_id).sum(dim=1).tolist())
        if on_batch is not None:
            on_batch(len(chunk))
    return completions, lengths


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    samples: Sequence[dict],
    *,
    template: str,
    reward_fn: Callable[[str, str], float],
    max_new_tokens: int,
    batch_size: int,
    n_examples: int = 3,
    on_batch: Callable[[int], None] | None = None,
) -> EvalResult:
    """Greedy accuracy of ``model`` on ``samples`` (dicts with ``question`` and ``answer``)."""
    if not samples:
        raise ValueError(
            "evaluate() needs at least one held-out sample (eval.n_problems / data.n_test)"
        )
    reward = SafeReward(reward_fn)
    prompts = [render_prompt(s["question"], template) for s in samples]
    completions, new_tokens = generate_greedy(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    scores = [reward(c, s["answer"]) for c, s in zip(completions, samples, strict=True)]
    n = len(scores)
    accuracy = sum(scores) / n
    return EvalResult(
        n=n,
        accuracy=accuracy,
        stderr=math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n),
        direct_share=sum(is_direct_answer(c) for c in completions) / n,
        mean_new_tokens=sum(new_tokens) / n,
        reward_failures=reward.n_failures,
        examples=[
            {"question": s["question"], "completion": c, "reference": s["answer"], "reward": r}
            for s, c, r in list(zip(samples, completions, scores, strict=True))[:n_examples]
        ],
    )
