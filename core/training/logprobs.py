"""Teacher-forced per-token log-probs (and entropy) aligned with ``input_ids``.

``out[:, t] = log softmax(logits[:, t-1] / T)[input_ids[:, t]]``: the log-prob of token ``t``
given the tokens before it, exactly what an inference engine reports for a sampled token at
temperature ``T`` (SGLang, vLLM and our HF engine all take ``log_softmax(logits / T)``).
Column 0 (nothing predicts it) and padding columns are 0. ``T = 0`` (greedy decoding) is treated
as 1, since greedy sampling has no distribution of its own to score against.

Logits are upcast to float32 before the softmax so bf16 models still give float32 log-probs.
"""

from __future__ import annotations

import torch
from torch import nn

Tensor = torch.Tensor


def effective_temperature(temperature: float) -> float:
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    return 1.0 if temperature == 0 else float(temperature)


def align(values: Tensor, attention_mask: Tensor) -> Tensor:
    """``[N, T-1]`` values for tokens ``1..T-1`` -> ``[N, T]`` with column 0 and padding 0."""
    out = torch.cat([values.new_zeros(values.shape[0], 1), values], dim=1)
    return torch.where(attention_mask.bool(), out, 0.0)


def scaled_logits(logits: Tensor, temperature: float) -> Tensor:
    """Float32 ``logits / T`` of the predicting positions ``0..T-2``."""
    return logits[:, :-1].float() / effective_temperature(temperature)


def logprobs_from_logits(
    logits: Tensor, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0
) -> Tensor:
    """``[N, T]`` aligned log-probs from ``[N, T, V]`` logits (see the module docstring)."""
    z = scaled_logits(logits, temperature)
    # gather - logsumexp == log_softmax gathered, without materialising a second [N, T, V].
    picked = z.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return align(picked - torch.logsumexp(z, dim=-1), attention_mask)


def entropy_from_logits(logits: Tensor, attention_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """``[N, T]`` entropy of the tempered next-token distribution that predicted each token."""
    z = scaled_logits(logits, temperature)
    log_p = torch.log_softmax(z, dim=-1)
    return align(-(log_p.exp() * log_p).sum(-1), attention_mask)


def _logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def token_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0
) -> Tensor:
    """Teacher-forced ``[N, T]`` log-probs of ``input_ids`` under ``model`` (right padding)."""
    logits = _logits(model, input_ids, attention_mask)
    return logprobs_from_logits(logits, input_ids, attention_mask, temperature)


def token_logprobs_and_entropy(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``token_logprobs`` plus the per-token entropy from the same forward pass."""
    logits = _logits(model, input_ids, attention_mask)
    return (
        logprobs_from_logits(logits, input_ids, attention_mask, temperature),
        entropy_from_logits(logits, attention_mask, temperature),
    )
