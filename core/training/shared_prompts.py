"""Shared prompts: each distinct prompt of a micro-batch runs through the model once.

GRPO-style batches hold ``G`` samples of every prompt, so a padded forward computes each prompt
``G`` times. Here the distinct prompts run once with a KV cache; the cache is indexed out to the
rows (``DynamicCache.batch_select_indices``, a differentiable gather) and every row's tokens
after its prompt -- its *suffix* -- attend to it at their own positions. Gradients flow back
through the cache into the prompt pass, summed over the rows that share it, so log-probs, losses
and gradients equal the padded forward's up to floating-point summation order (the tests check
both, in fp32 with SDPA). Two differences by design: dropout (LoRA's, attention's) draws one
mask per prompt, shared by its samples, where the padded pass draws one per row; and a RoPE
whose scaling depends on the sequence length (``dynamic``, ``longrope``) can pick different
frequencies for the prompt pass and the suffix pass past the original context length. The same idea as the engine's prefill-once-then-fork, on the training side; the hydragen
and cascade-inference kernels do it inside attention.

Positions computed fall from ``N · T`` to ``U · P + N · S`` (``U`` distinct prompts padded to
``P``, suffixes padded to ``S``); with 16 prompts × 8 samples of ~40 prompt tokens that is
about 0.6× (``experiments/benchmarks/learner_packing.py`` measures the step time).

Log-probs are read without materialising ``[N, T, V]``: the prompt pass's ``[U·P, V]`` and the
suffix pass's ``[N·S, V]`` logits form one table of *predicting rows*, and ``source[n, t]`` names
the row that holds the logits at position ``t`` of row ``n`` (see :func:`logprobs_from_rows`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from core.training.batch import TrainBatch
from core.training.logprobs import align, effective_temperature

Tensor = torch.Tensor


@dataclass(frozen=True)
class SharedPrompts:
    """The shared-prompt layout of a right-padded ``[N, T]`` micro-batch."""

    prompt_ids: Tensor  # [U, P]: the distinct prompts, right-padded
    prompt_mask: Tensor  # [U, P]
    owner: Tensor  # [N]: the prompt each row continues
    suffix_ids: Tensor  # [N, S]: each row's tokens after its prompt, right-padded
    suffix_mask: Tensor  # [N, S]
    suffix_positions: Tensor  # [N, S]: prompt_len, prompt_len + 1, ...
    source: Tensor  # [N, T]: row of the [U*P + N*S] logits table for each position (pad -> 0)

    @property
    def n_prompts(self) -> int:
        return self.prompt_ids.shape[0]


def sharing_unsupported(config: object) -> str | None:
    """Why a model cannot share prompts (``None`` when it can): a layer that is not full
    attention keeps a cache that is not a plain prefix, and its mask counts cache slots, not
    positions. Layers are read from ``layer_types``, else inferred as transformers does: a
    ``sliding_window`` (unless ``use_sliding_window`` is false) or an ``attention_chunk_size``."""
    layer_types = set(getattr(config, "layer_types", None) or [])
    if layer_types - {"full_attention"}:
        return f"its layer types are {sorted(layer_types)}, not only full_attention"
    if not layer_types:
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            return f"it attends over a sliding window of {config.sliding_window} tokens"
        if getattr(config, "attention_chunk_size", None):
            return "it attends in chunks (attention_chunk_size)"
    return None


def clamped_prompt_lens(prompt_lens: Tensor, seq_lens: Tensor) -> Tensor:
    """Prompt lengths within ``[1, seq_len]``: position 0 is always prompt (nothing predicts
    it), and a prompt cannot be longer than its row."""
    return prompt_lens.clamp(min=1).minimum(seq_lens)


def prompt_groups(input_ids: Tensor, prompt_lens: Tensor) -> list[list[int]]:
    """Row indices grouped by identical prompt tokens, groups in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, (ids, length) in enumerate(zip(input_ids.tolist(), prompt_lens.tolist(), strict=True)):
        groups.setdefault(tuple(ids[:length]), []).append(row)
    return list(groups.values())


def shared_cost(prompt_lens: list[int], seq_lens: list[int], groups: int) -> int:
    """Positions the shared forward computes for these rows: ``U · P + N · S``."""
    suffix = max(s - p for s, p in zip(seq_lens, prompt_lens, strict=True))
    return groups * max(prompt_lens) + len(seq_lens) * max(suffix, 1)


def share_prompts(input_ids: Tensor, attention_mask: Tensor, prompt_lens: Tensor) -> SharedPrompts:
    """The shared-prompt layout of right-padded rows (``n_prompts == N`` when nothing is shared)."""
    device = input_ids.device
    input_ids, attention_mask = input_ids.cpu(), attention_mask.cpu()  # one copy each
    n, width = input_ids.shape
    seq_lens = attention_mask.sum(-1)
    prompt_lens = clamped_prompt_lens(prompt_lens.cpu(), seq_lens)
    groups = prompt_groups(input_ids, prompt_lens)
    suffix_lens = seq_lens - prompt_lens
    s = max(int(suffix_lens.max()), 1)  # rows that are all prompt get one padding position
    u, p = len(groups), int(prompt_lens.max())
    owner = torch.empty(n, dtype=torch.long)
    firsts = torch.tensor([g[0] for g in groups])
    for g, rows in enumerate(groups):
        owner[rows] = g
    cols_p, cols_s, cols_t = torch.arange(p), torch.arange(s), torch.arange(width)
    prompt_mask = (cols_p < prompt_lens[firsts, None]).long()
    prompt_ids = input_ids[firsts, :p] * prompt_mask
    suffix_mask = (cols_s < suffix_lens[:, None]).long()
    gather = (prompt_lens[:, None] + cols_s).clamp(max=width - 1)
    suffix_ids = input_ids.gather(1, gather) * suffix_mask
    in_prompt = cols_t < prompt_lens[:, None]
    from_prompt = owner[:, None] * p + cols_t.clamp(max=p - 1)
    from_suffix = (
        u * p + torch.arange(n)[:, None] * s + (cols_t - prompt_lens[:, None]).clamp(0, s - 1)
    )
    source = torch.where(in_prompt, from_prompt, from_suffix) * attention_mask
    return SharedPrompts(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        owner=owner.to(device),
        suffix_ids=suffix_ids.to(device),
        suffix_mask=suffix_mask.to(device),
        suffix_positions=(prompt_lens[:, None] + cols_s).to(device),
        source=source.to(device),
    )


def cache_kwarg(model: nn.Module) -> str:
    """The name transformers gives the KV cache argument and output: ``cache`` since 5.2x,
    ``past_key_values`` before (the GPU image's version). A peft model passes it through."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def shared_logits(model: nn.Module, layout: SharedPrompts) -> Tensor:
    """The ``[U·P + N·S, V]`` logits table: one prompt pass, then one pass of the suffixes."""
    name = cache_kwarg(model)
    prompts = model(input_ids=layout.prompt_ids, attention_mask=layout.prompt_mask, use_cache=True)
    cache = getattr(prompts, name)
    cache.batch_select_indices(layout.owner)  # [U, ...] -> [N, ...]; backward sums the rows
    suffixes = model(
        input_ids=layout.suffix_ids,
        attention_mask=torch.cat([layout.prompt_mask[layout.owner], layout.suffix_mask], dim=1),
        position_ids=layout.suffix_positions,
        use_cache=True,
        **{name: cache},
    )
    vocab = prompts.logits.shape[-1]
    return torch.cat([prompts.logits.reshape(-1, vocab), suffixes.logits.reshape(-1, vocab)])


def logprobs_from_rows(
    table: Tensor,
    source: Tensor,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    *,
    entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``[N, T]`` aligned log-probs (and entropies) from a ``[M, V]`` logits table.

    ``source[:, t]`` is the table row holding the logits at position ``t``, so token ``t`` is
    scored by row ``source[:, t - 1]``: the padded case is ``table = logits.reshape(-1, V)`` with
    ``source = arange(N * T).view(N, T)``.
    """
    z = table.float() / effective_temperature(temperature)
    log_norm = torch.logsumexp(z, dim=-1)
    predictors = source[:, :-1]
    picked = z[predictors, input_ids[:, 1:]] - log_norm[predictors]
    logprobs = align(picked, attention_mask)
    if not entropy:
        return logprobs, None
    log_p = z - log_norm[:, None]
    per_row = -(log_p.exp() * log_p).sum(-1)
    return logprobs, align(per_row[predictors], attention_mask)


def shared_micro_batch_indices(batch: TrainBatch, max_tokens: int) -> list[Tensor]:
    """Row indices of each micro-batch, keeping the rows of a prompt together.

    Like ``micro_batch_indices`` (longest first, greedy), but a micro-batch's cost is what the
    shared forward computes (:func:`shared_cost`), so a group of ``G`` samples costs its prompt
    once. A group over the budget on its own is cut into pieces that fit (a row longer than the
    budget gets a micro-batch to itself). A micro-batch that shares nothing costs at least its
    padded ``N · T``, so the budget holds for the padded fallback too.
    """
    if max_tokens < 1:
        raise ValueError(f"micro_batch_tokens={max_tokens} must be >= 1")
    seq_lens = batch.seq_lens.clamp(min=1)
    prompt_lens = clamped_prompt_lens(batch.prompt_lens, seq_lens)
    seq, plen = seq_lens.tolist(), prompt_lens.tolist()

    def cost(rows: list[int], groups: int) -> int:
        return shared_cost([plen[r] for r in rows], [seq[r] for r in rows], groups)

    units: list[list[int]] = []
    for rows in prompt_groups(batch.input_ids, prompt_lens):
        piece: list[int] = []
        for row in sorted(rows, key=lambda r: -seq[r]):
            if piece and cost([*piece, row], 1) > max_tokens:
                units.append(piece)
                piece = []
            piece.append(row)
        units.append(piece)
    units.sort(key=lambda unit: -seq[unit[0]])  # stable: ties keep first-appearance order
    packs: list[tuple[list[int], int]] = []  # (rows, groups)
    for unit in units:
        if packs and cost(packs[-1][0] + unit, packs[-1][1] + 1) <= max_tokens:
            packs[-1] = (packs[-1][0] + unit, packs[-1][1] + 1)
        else:
            packs.append((unit, 1))
    return [torch.tensor(sorted(rows), dtype=torch.long) for rows, _ in packs]
