"""Per-row next-token sampling for a batch whose rows have different sampling parameters.

The logprob we return is ``log_softmax(logits / T)`` at the chosen token (``T == 0`` means
``log_softmax(logits)``): the temperature-scaled distribution *before* top-k/top-p truncation.
That is what the learner recomputes from its own forward pass, so the importance ratio between
behaviour and proximal policy is exact when the weights match. SGLang's default logprobs are the
same quantity (as long as ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is not set).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.inference.api import SamplingParams


@dataclass
class BatchSampling:
    """Sampling parameters of a batch as tensors, one entry per row."""

    temperature: torch.Tensor  # [B] float, 1.0 on greedy rows (their logits are not scaled)
    greedy: torch.Tensor  # [B] bool
    top_p: torch.Tensor  # [B] float
    top_k: torch.Tensor  # [B] long, vocabulary size where off
    all_greedy: bool
    needs_truncation: bool

    @classmethod
    def from_params(
        cls, params: list[SamplingParams], vocab_size: int, device: torch.device
    ) -> BatchSampling:
        greedy = [p.temperature == 0 for p in params]
        temps = [1.0 if g else float(p.temperature) for g, p in zip(greedy, params, strict=True)]
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        needs_truncation = any(
            not g and (p.top_p < 1.0 or k < vocab_size)
            for g, p, k in zip(greedy, params, top_k, strict=True)
        )
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_p=torch.tensor(
                [float(p.top_p) for p in params], dtype=torch.float32, device=device
            ),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            all_greedy=all(greedy),
            needs_truncation=needs_truncation,
        )


def validate_sampling(params: SamplingParams) -> None:
    """Reject parameters that would make sampling undefined (named after the field)."""
    if params.temperature < 0:
        raise ValueError(f"temperature={params.temperature} must be >= 0 (0 = greedy)")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p={params.top_p} must be in (0, 1]")
    if params.top_k < 0:
        raise ValueError(f"top_k={params.top_k} must be >= 0 (0 = off)")


def truncate_logits(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) everything outside each row's top-k and top-p nucleus.

    Like SGLang's torch sampler, both cuts use the cumulative probability of the full
    (temperature-scaled) distribution sorted in descending order; the top token always survives.
    """
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    cumulative = probs.cumsum(dim=-1)
    ranks = torch.arange(scaled.shape[-1], device=scaled.device)
    remove = (ranks[None, :] >= top_k[:, None]) | ((cumulative - probs) > top_p[:, None])
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)


def sample_next(
    logits: torch.Tensor, sampling: BatchSampling, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return ``(token_ids [B], logprobs [B])``."""
    logits = logits.float()
    scaled = logits / sampling.temperature[:, None]
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    argmax = logits.argmax(dim=-1)
    if sampling.all_greedy:
        tokens = argmax
    else:
        masked = (
            truncate_logits(scaled, sampling.top_k, sampling.top_p)
            if sampling.needs_truncation
            else scaled
        )
        sampled = torch.multinomial(masked.softmax(dim=-1), 1, generator=generator).squeeze(1)
        tokens = torch.where(sampling.greedy, argmax, sampled)
    logprobs = logprobs_all.gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs
