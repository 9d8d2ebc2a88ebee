"""SGLang's logit processors on a batch: penalties, ``min_new_tokens`` and ``logit_bias``.

What each does follows SGLang (``sglang/srt/sampling/penaltylib/``, applied by
``SamplingBatchInfo.apply_logits_bias`` before the sampler divides by the temperature), with
``c[v]`` the number of times token ``v`` is in the request's *generated* tokens (never the prompt):

- additive: ``logits[v] -= frequency_penalty * c[v] + presence_penalty * (c[v] > 0)`` (as
  OpenAI's penalties), and ``-inf`` on the stop tokens (``stop_token_ids`` and the eos ids) while
  fewer than ``min_new_tokens`` tokens are out;
- then scaling, for ``c[v] > 0``: ``logits[v] / repetition_penalty`` where the logit is
  positive, ``logits[v] * repetition_penalty`` where it is negative (Keskar et al. 2019, CTRL, as
  HF's ``RepetitionPenaltyLogitsProcessor`` computes it; HF counts the prompt too, SGLang only
  the output, and so do we);
- then ``logit_bias[v]`` added.

Everything is per row: a row whose parameters are the defaults keeps its logits bit for bit.
:class:`RoundPenalties` holds one round's state (token counts per row, updated after each step)
so the engine builds it once per round, not once per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.inference.api import SamplingParams


def additive_penalties(
    logits: torch.Tensor, counts: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor
) -> torch.Tensor:
    """``logits - frequency * counts - presence * (counts > 0)``; ``logits, counts [B, V]``,
    ``frequency, presence [B]``."""
    penalty = counts * frequency[:, None] + (counts > 0) * presence[:, None]
    return logits - penalty


def repetition_penalty(
    logits: torch.Tensor, counts: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """Generated tokens' logits: positive ones divided by ``penalty [B]``, negative multiplied."""
    scaled = torch.where(logits < 0, logits * penalty[:, None], logits / penalty[:, None])
    return torch.where(counts > 0, scaled, logits)


def stop_token_mask(
    logits: torch.Tensor, stop_ids: torch.Tensor, active: torch.Tensor
) -> torch.Tensor:
    """``-inf`` where ``stop_ids [B, V]`` (bool) on rows where ``active [B]`` (bool)."""
    return logits.masked_fill(stop_ids & active[:, None], float("-inf"))


@dataclass
class RoundPenalties:
    """One round's penalties for the rows of a batch; ``None`` from :meth:`build` when no row
    has any (the common case costs nothing). A ``[B, V]`` tensor is only made for what some row
    uses: ``counts`` for the penalties, ``held`` for ``min_new_tokens``, ``bias``."""

    frequency: torch.Tensor  # [B]
    presence: torch.Tensor  # [B]
    repetition: torch.Tensor  # [B], 1 = off
    min_new: torch.Tensor  # [B] long
    n_out: torch.Tensor  # [B] long: tokens of this submission generated so far per row
    counts: torch.Tensor | None  # [B, V] float: generated tokens per row so far
    held: torch.Tensor | None  # [B, V] bool: what min_new_tokens holds back
    bias: torch.Tensor | None  # [B, V] float
    additive: bool  # some row has a frequency or presence penalty
    scaling: bool  # some row has a repetition penalty

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        histories: Sequence[Sequence[int]],
        stop_ids: Sequence[frozenset[int]],
        n_out: Sequence[int],
        vocab_size: int,
        device: torch.device,
    ) -> RoundPenalties | None:
        """``histories``: each row's generated tokens so far, what it generated before an
        interruption included (the penalties count them); ``stop_ids``: each row's stop tokens
        and eos ids, held back while its output (``n_out`` tokens so far: a resubmission's
        ``min_new_tokens`` is already what is left of it) is shorter than ``min_new_tokens``."""
        additive = any(p.frequency_penalty or p.presence_penalty for p in params)
        scaling = any(p.repetition_penalty != 1.0 for p in params)
        holding = any(p.min_new_tokens > n for p, n in zip(params, n_out, strict=True))
        biased = any(p.logit_bias for p in params)
        if not (additive or scaling or holding or biased):
            return None

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            frequency=floats([p.frequency_penalty for p in params]),
            presence=floats([p.presence_penalty for p in params]),
            repetition=floats([p.repetition_penalty for p in params]),
            min_new=torch.tensor([p.min_new_tokens for p in params], device=device),
            n_out=torch.tensor(list(n_out), device=device),
            counts=_counts(histories, vocab_size, device) if additive or scaling else None,
            held=_held(stop_ids, vocab_size, device) if holding else None,
            bias=_bias(params, vocab_size, device) if biased else None,
            additive=additive,
            scaling=scaling,
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed logits (float32 ``[B, V]``) for this step, in SGLang's order."""
        if self.additive:
            assert self.counts is not None
            logits = additive_penalties(logits, self.counts, self.frequency, self.presence)
        if self.held is not None:
            logits = stop_token_mask(logits, self.held, self.n_out < self.min_new)
        if self.scaling:
            assert self.counts is not None
            logits = repetition_penalty(logits, self.counts, self.repetition)
        if self.bias is not None:
            logits = logits + self.bias
        return logits

    def record(self, tokens: torch.Tensor) -> None:
        """Count the tokens just sampled (one per row) as generated."""
        if self.counts is not None:
            self.counts.scatter_add_(1, tokens[:, None], torch.ones_like(self.counts[:, :1]))
        self.n_out += 1


def _counts(
    histories: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    counts = torch.zeros((len(histories), vocab_size), dtype=torch.float32)
    for row, history in enumerate(histories):
        ids = torch.tensor([t for t in history if 0 <= t < vocab_size], dtype=torch.long)
        counts[row].index_add_(0, ids, torch.ones(len(ids)))
    return counts.to(device)


def _held(
    stop_ids: Sequence[frozenset[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    held = torch.zeros((len(stop_ids), vocab_size), dtype=torch.bool)
    for row, ids in enumerate(stop_ids):
        held[row, [t for t in ids if 0 <= t < vocab_size]] = True
    return held.to(device)


def _bias(params: Sequence[SamplingParams], vocab_size: int, device: torch.device) -> torch.Tensor:
    bias = torch.zeros((len(params), vocab_size), dtype=torch.float32)
    for row, p in enumerate(params):
        for token, value in p.logit_bias.items():
            if 0 <= token < vocab_size:
                bias[row, token] += value
    return bias.to(device)
