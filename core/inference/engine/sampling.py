"""Per-row next-token sampling for a batch whose rows have different sampling parameters.

The logprob we return is ``log_softmax(logits / T)`` at the chosen token (``T == 0`` means
``log_softmax(logits)``), where ``logits`` are the ones the token was sampled from: the model's,
after the request's penalties, ``min_new_tokens`` mask and ``logit_bias``
(:mod:`core.inference.engine.penalties`), and *before* the top-k/top-p/min-p truncation. That is
SGLang's convention: its sampler returns ``log(softmax(logits / T))`` of the logits after
``apply_logits_bias`` (penalties, grammar mask, bias) and before its top-k/top-p/min-p
sampling kernels (unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set, which drops the
temperature). Without penalties it is what the learner recomputes from its own forward pass, so
the importance ratio between behaviour and proximal policy is exact when the weights match; with
penalties it is the log-prob of the penalised distribution that was actually sampled from, so the
ratio corrects for them. The truncations are left out on purpose: inside the kept set the
truncated distribution differs from this one only by the log of the kept mass, a per-position
constant, while a logprob of the truncated distribution would be ``-inf`` for the learner's
tokens outside it.

Sampling uses the Gumbel-max trick (Gumbel 1954; Maddison, Tarlow & Minka 2014, "A* Sampling";
Jang, Gu & Poole 2017): ``argmax(masked_logits + G)`` with ``G = -log(-log U)``, ``U ~ U(0, 1)``
i.i.d. per vocabulary entry, is an exact sample from ``softmax(masked_logits)``. Its point is
where ``U`` comes from. A row whose request has a ``seed`` takes ``U`` from a counter-based hash
of ``(seed, position, vocabulary index)`` (:func:`counter_hash`), where ``position`` is the total
sequence length when the token is sampled (prompt as submitted + output so far). The token at a
position then depends only on the seed, the position and the logits: not on which requests
share the batch, not on the engine's generator, and not on whether the request was interrupted
and resubmitted as prompt + partial output (the position is the same either way), so a reference
implementation can reproduce the engine's samples from teacher-forced logits. Rows without a
seed draw ``U`` from the engine's ``torch.Generator``, as vLLM and SGLang do for unseeded
requests. Noise and the perturbed logits are float64, so the 32-bit ``U`` and the float32
logits lose nothing when combined.

The hash is murmur3's 32-bit finaliser (``fmix32``) evaluated on int64 tensors holding values in
``[0, 2**32)``. 32-bit multiplications split the constant into 16-bit halves so that no
intermediate reaches ``2**49``: nothing relies on integer overflow (undefined for signed
integers in C, and not something torch promises to wrap identically on every device).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from core.inference.api import SamplingParams
from core.inference.stop_strings import stop_string_problems

_MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF
# Salts keep the seed and index streams apart (and off 0, a fixed point of fmix32).
_SEED_SALT = 0x9E3779B9  # 2**32 / golden ratio
_INDEX_SALT = 0x7F4A7C15
_TINY = torch.finfo(torch.float64).tiny


@dataclass
class BatchSampling:
    """Sampling parameters of a batch as tensors, one entry per row."""

    temperature: torch.Tensor  # [B] float, 1.0 on greedy rows (their logits are not scaled)
    greedy: torch.Tensor  # [B] bool
    top_p: torch.Tensor  # [B] float
    top_k: torch.Tensor  # [B] long, vocabulary size where off
    min_p: torch.Tensor  # [B] float, 0 where off
    seeds: torch.Tensor  # [B, 2] long: low and high 32-bit halves of seed mod 2**64 (0 if none)
    has_seed: torch.Tensor  # [B] bool
    seed_keys: torch.Tensor  # [B] long: the seeds mixed once per round (see seed_keys())
    seeded_rows: torch.Tensor  # [n] long: sampled (non-greedy) rows with a seed
    random_rows: torch.Tensor  # [m] long: sampled rows that use the engine's generator
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
            not g and (p.top_p < 1.0 or k < vocab_size or p.min_p > 0)
            for g, p, k in zip(greedy, params, top_k, strict=True)
        )
        has_seed = [p.seed is not None for p in params]
        sampled = [i for i, g in enumerate(greedy) if not g]

        def long(values: list) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        seeds = long([split_seed(p.seed or 0) for p in params]).reshape(len(params), 2)
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_p=torch.tensor(
                [float(p.top_p) for p in params], dtype=torch.float32, device=device
            ),
            top_k=long(top_k),
            min_p=torch.tensor(
                [float(p.min_p) for p in params], dtype=torch.float32, device=device
            ),
            seeds=seeds,
            has_seed=torch.tensor(has_seed, dtype=torch.bool, device=device),
            seed_keys=seed_keys(seeds[:, 0], seeds[:, 1]),
            seeded_rows=long([i for i in sampled if has_seed[i]]),
            random_rows=long([i for i in sampled if not has_seed[i]]),
            all_greedy=all(greedy),
            needs_truncation=needs_truncation,
        )


def validate_sampling(params: SamplingParams) -> None:
    """Reject parameters that would make sampling undefined (named after the field).

    Checked per request before it joins a batch: a NaN temperature or an infinite top-p would
    otherwise turn its row's logits into NaN, and a float ``top_k`` would break the batch's
    tensors for every request in it.
    """
    if not is_int(params.max_new_tokens):
        raise ValueError(f"max_new_tokens={params.max_new_tokens!r} must be an integer")
    for name in ("temperature", "top_p"):
        value = getattr(params, name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be a number")
        if not math.isfinite(value):
            raise ValueError(f"{name}={value} must be finite")
    if params.temperature < 0:
        raise ValueError(f"temperature={params.temperature} must be >= 0 (0 = greedy)")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p={params.top_p} must be in (0, 1]")
    _check_sglang_fields(params)
    if not is_int(params.top_k) or params.top_k < 0:
        raise ValueError(f"top_k={params.top_k!r} must be an integer >= 0 (0 = off)")
    if params.seed is not None and not is_int(params.seed):
        raise ValueError(f"seed={params.seed!r} must be an integer or None")
    if problems := stop_string_problems(params.stop, "stop"):
        raise ValueError(problems[0])


# SGLang's ranges (SamplingParams.verify in sglang/srt/sampling/sampling_params.py)
_RANGES = {
    "min_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.0, 2.0),  # 0 excluded, see below
}


def _check_sglang_fields(params: SamplingParams) -> None:
    for name, (low, high) in _RANGES.items():
        value = getattr(params, name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be a number")
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{name}={value} must be in [{low}, {high}]")
    if params.repetition_penalty == 0:
        raise ValueError("repetition_penalty=0 must be in (0, 2] (1 = off)")
    if not is_int(params.min_new_tokens) or params.min_new_tokens < 0:
        raise ValueError(f"min_new_tokens={params.min_new_tokens!r} must be an integer >= 0")
    if not isinstance(params.ignore_eos, bool):
        raise ValueError(f"ignore_eos={params.ignore_eos!r} must be a boolean")
    for token, bias in params.logit_bias.items():
        if not is_int(token) or isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ValueError(f"logit_bias[{token!r}]={bias!r}: integer token ids to numbers")
        if not math.isfinite(bias):
            raise ValueError(f"logit_bias[{token}]={bias} must be finite")


def is_int(value: object) -> bool:
    """A JSON integer: ``int`` but not ``bool`` (``True`` is an ``int`` in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def split_seed(seed: int) -> tuple[int, int]:
    """``seed mod 2**64`` as (low, high) 32-bit halves: any Python int is a valid seed."""
    seed %= 1 << 64
    return seed & _MASK32, seed >> 32


def _mul32_(x: torch.Tensor, c: int, tmp: torch.Tensor) -> None:
    """``x = x * c mod 2**32`` in place, for ``x`` in ``[0, 2**32)``; no intermediate reaches
    ``2**49``. With ``c = c_hi * 2**16 + c_lo``, ``x * c_hi * 2**16 mod 2**32`` only needs
    ``x * c_hi mod 2**16``."""
    torch.mul(x, c >> 16, out=tmp)
    tmp.bitwise_and_(_MASK16).bitwise_left_shift_(16)
    x.mul_(c & _MASK16).add_(tmp).bitwise_and_(_MASK32)


def _xorshift_(x: torch.Tensor, shift: int, tmp: torch.Tensor) -> None:
    torch.bitwise_right_shift(x, shift, out=tmp)
    x.bitwise_xor_(tmp)


def fmix32_(x: torch.Tensor, tmp: torch.Tensor | None = None) -> torch.Tensor:
    """Murmur3's 32-bit finaliser, in place: a bijection on ``[0, 2**32)`` with full avalanche.

    ``x`` is an int64 tensor with values in ``[0, 2**32)``. In place with one scratch tensor
    (``tmp``, same shape) because on a ``[B, vocab]`` batch every allocation is a pass over
    memory of its own.
    """
    tmp = torch.empty_like(x) if tmp is None else tmp
    _xorshift_(x, 16, tmp)
    _mul32_(x, 0x85EBCA6B, tmp)
    _xorshift_(x, 13, tmp)
    _mul32_(x, 0xC2B2AE35, tmp)
    _xorshift_(x, 16, tmp)
    return x


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """:func:`fmix32_` on a copy."""
    return fmix32_(x.clone())


def seed_keys(seed_lo: torch.Tensor, seed_hi: torch.Tensor) -> torch.Tensor:
    """Both halves of a 64-bit seed mixed into one 32-bit key (a request's, fixed per round)."""
    return fmix32_(fmix32(seed_lo ^ _SEED_SALT) ^ seed_hi)


def position_keys(keys: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """A seed key mixed with a sequence position (``< 2**32``: no sequence is that long)."""
    return fmix32_(keys ^ position)


def index_keys(index: torch.Tensor) -> torch.Tensor:
    return fmix32_(index ^ _INDEX_SALT)


@functools.lru_cache(maxsize=8)
def _vocab_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    return index_keys(torch.arange(vocab_size, dtype=torch.long, device=device))


def counter_hash(
    seed_lo: torch.Tensor, seed_hi: torch.Tensor, position: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    """A 32-bit hash of ``(seed, position, index)``; int64 inputs in ``[0, 2**32)``, broadcast.

    ``fmix32(position_key ^ index_key)``: the (seed, position) key has been through three fmix32
    rounds and the index through one, so every input bit reaches every output bit. For a fixed
    (seed, position) the map from index to hash is a bijection: no two vocabulary entries of a
    row share a uniform. Sampling computes the same value with the key parts cached.
    """
    keys = position_keys(seed_keys(seed_lo, seed_hi), position)
    return fmix32_(keys ^ index_keys(index))


def _row_hashes(keys: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``counter_hash`` for rows with seed ``keys [N]`` at ``positions [N]``: ``[N, vocab]``."""
    rows = position_keys(keys, positions)
    return fmix32_(rows[:, None] ^ _vocab_keys(vocab_size, keys.device))


def seeded_uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``U`` in (0, 1), float64 ``[N, vocab_size]``, for rows with ``seeds [N, 2]`` (32-bit
    halves, as :func:`split_seed` gives) at ``positions [N]``."""
    return _unit(_row_hashes(seed_keys(seeds[:, 0], seeds[:, 1]), positions, vocab_size))


def _unit(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> float64 ``(h + 0.5) / 2**32``: exact, and never 0 or 1."""
    return h.double().add_(0.5).mul_(2.0**-32)


def _log_neg_log_(u: torch.Tensor) -> torch.Tensor:
    """``log(-log u)`` in place: minus standard Gumbel noise, from uniforms in (0, 1)."""
    return u.log_().neg_().log_()


def gumbel_(u: torch.Tensor) -> torch.Tensor:
    """``-log(-log u)`` in place: standard Gumbel noise from uniforms in (0, 1).

    ``argmax(scaled.double() + gumbel_(seeded_uniforms(...)))`` is exactly the engine's pick
    (it subtracts ``log(-log u)``, the same float64 sum), e.g. for a reference implementation.
    """
    return _log_neg_log_(u).neg_()


def _perturb_rows(noisy: torch.Tensor, rows: torch.Tensor, log_neg_log_u: torch.Tensor) -> None:
    """``noisy[rows] += G`` with ``G = -log(-log u)``."""
    if rows.numel() == noisy.shape[0]:  # rows are sorted and distinct: all of them, in order
        noisy.sub_(log_neg_log_u)
    else:
        noisy.index_add_(0, rows, log_neg_log_u, alpha=-1)


def gumbel_argmax(
    masked: torch.Tensor,
    sampling: BatchSampling,
    generator: torch.Generator,
    positions: torch.Tensor,
) -> torch.Tensor:
    """One sample per non-greedy row of ``softmax(masked)`` (greedy rows: argmax, unperturbed)."""
    noisy = masked.double()
    vocab = masked.shape[-1]
    rows = sampling.seeded_rows
    if rows.numel():
        keys = sampling.seed_keys
        if rows.numel() < len(keys):  # else all rows, in order: no gathers on the hot path
            keys, positions = keys[rows], positions[rows]
        u = _unit(_row_hashes(keys, positions, vocab))
        _perturb_rows(noisy, rows, _log_neg_log_(u))
    rows = sampling.random_rows
    if rows.numel():
        u = torch.rand(
            (rows.numel(), vocab), generator=generator, dtype=torch.float64, device=masked.device
        )
        _perturb_rows(noisy, rows, _log_neg_log_(u.clamp_(min=_TINY)))  # rand may give 0
    return noisy.argmax(dim=-1)


def truncate_logits(
    scaled: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask (to -inf) everything outside each row's top-k, top-p nucleus and min-p set.

    Like SGLang's torch sampler (``top_k_top_p_min_p_sampling_from_probs_torch``), all cuts use
    the probabilities of the full (temperature-scaled) distribution sorted in descending order:
    min-p drops tokens whose probability is below ``min_p`` times the top token's (Nguyen et al.
    2024, "Min-p sampling"). The top token always survives.
    """
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    cumulative = probs.cumsum(dim=-1)
    ranks = torch.arange(scaled.shape[-1], device=scaled.device)
    remove = (ranks[None, :] >= top_k[:, None]) | ((cumulative - probs) > top_p[:, None])
    if min_p is not None:
        remove |= probs < probs[:, :1] * min_p[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)


def sample_next(
    logits: torch.Tensor,
    sampling: BatchSampling,
    generator: torch.Generator,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return ``(token_ids [B], logprobs [B])``.

    ``logits`` are the processed ones (after :class:`~core.inference.engine.penalties.RoundPenalties`).
    ``positions [B]`` (long) is each row's sequence length when sampling (prompt + output so
    far); it keys the noise of seeded rows and is ignored for the others.
    """
    logits = logits.float()
    scaled = logits / sampling.temperature[:, None]
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    tokens = logits.argmax(dim=-1)
    if not sampling.all_greedy:
        masked = (
            truncate_logits(scaled, sampling.top_k, sampling.top_p, sampling.min_p)
            if sampling.needs_truncation
            else scaled
        )
        sampled = gumbel_argmax(masked, sampling, generator, positions)
        tokens = torch.where(sampling.greedy, tokens, sampled)
    logprobs = logprobs_all.gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs
