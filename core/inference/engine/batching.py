"""Generation rounds: prefill new requests, then decode the whole batch one token per step.

A round takes the engine's running requests and decodes one forward per step for all of them
with a ``DynamicCache``, until every row is finished or the engine's ``should_stop`` ends it
(pause, requests waiting to join, many finished rows). Between rounds the batch is kept
(:class:`~core.inference.engine.kv_batch.LiveBatch`): finished rows leave, new requests are prefilled on
their own and join, and the surviving rows keep their KV cache. Where splicing caches is not
possible (``splice=False``, or sliding-window/quantized cache layers) the next round re-prefills
``prompt + generated-so-far`` of every row instead -- simple and exact, but on CPU it costs as
much as the decoding itself at high concurrency (see ``reprefilled_tokens`` and ``prefill_s``).

Requests that arrive with the same tokens -- the ``G`` samples of one prompt in GRPO-style
grouped sampling -- are prefilled once and their KV cache is copied to each member (one prefill
per group, ``share_prefill``); ``shared_prefill_tokens`` counts the prompt tokens not computed
again. The copies are exact: every member starts from the same logits and cache it would have
computed on its own, and samples from there with its own noise.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from core.inference.api import GenerationRequest, GenerationResponse, StopReason
from core.inference.engine.kv_batch import (
    LiveBatch,
    adopt_layer,
    growing_cache,
    left_pad,
    roomy_buffer,
    splice_supported,
)
from core.inference.engine.penalties import RoundPenalties
from core.inference.engine.prefix_cache import PrefixCache
from core.inference.engine.sampling import BatchSampling, sample_next

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Slot:
    """A request inside the engine: its output so far and the future its caller awaits.

    ``stop_ids`` end generation when sampled (none with ``ignore_eos``); ``held_ids`` (the stop
    token ids and the eos ids, with or without ``ignore_eos``) cannot be sampled before
    ``min_new_tokens``, as SGLang's ``BatchedMinNewTokensPenalizer`` holds them back.
    """

    request: GenerationRequest
    stop_ids: frozenset[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: StopReason | None = None
    stop_check: Callable[[list[int]], bool] | None = None  # stop strings, on the output so far
    n_interrupts: int = 0  # retracted and re-prefilled by a pause in "retract" mode
    arrival: int | None = None  # its place in the engine's queue among equal priorities
    cancelled: bool = False  # the caller stopped waiting; drop silently
    held_ids: frozenset[int] = frozenset()

    def history(self) -> list[int]:
        """The tokens this request generated: its output plus what it generated before an
        interruption (resubmitted at the end of its prompt); the penalties count these."""
        resumed = self.request.resumed_tokens
        return (self.request.input_ids[-resumed:] if resumed else []) + self.output

    def on_future_done(self, future: asyncio.Future) -> None:
        self.cancelled = future.cancelled()

    def append(self, token: int, logprob: float, version: int) -> None:
        self.output.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if token in self.stop_ids or (self.stop_check is not None and self.stop_check(self.output)):
            self.finish = "stop"
        elif len(self.output) >= self.request.sampling.max_new_tokens:
            self.finish = "length"

    def response(self) -> GenerationResponse:
        assert self.finish is not None
        return GenerationResponse(
            list(self.output),
            list(self.logprobs),
            list(self.versions),
            self.finish,
            self.n_interrupts,
        )


@dataclass
class RoundStats:
    """What one round cost."""

    rows: int = 0
    prefill_tokens: int = 0
    reprefilled_tokens: int = 0  # generated tokens prefilled again (the cost of re-batching)
    shared_prefill_tokens: int = 0  # tokens a request got from an identical one's prefill
    prefix_cached_tokens: int = 0  # tokens a request got from a finished request it continues
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    tokens: int = 0

    def merge(self, other: RoundStats) -> None:
        """Add ``other``'s counts (rounds run one after another, reported as one)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class EngineStats:
    """Counters since the engine started (written by the worker thread only)."""

    requests_served: int = 0
    tokens_generated: int = 0
    batches: int = 0  # rounds: one prefill each, then decode steps
    rows: int = 0  # requests summed over rounds
    decode_steps: int = 0
    prefill_tokens: int = 0
    reprefilled_tokens: int = 0
    shared_prefill_tokens: int = 0
    prefix_cached_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    aborted: int = 0

    def add(self, r: RoundStats) -> None:
        self.batches += 1
        self.rows += r.rows
        self.decode_steps += r.decode_steps
        self.tokens_generated += r.tokens
        self.prefill_tokens += r.prefill_tokens
        self.reprefilled_tokens += r.reprefilled_tokens
        self.shared_prefill_tokens += r.shared_prefill_tokens
        self.prefix_cached_tokens += r.prefix_cached_tokens
        self.prefill_s += r.prefill_s
        self.decode_s += r.decode_s

    @property
    def mean_batch_size(self) -> float:
        """Requests per round (how many requests shared a prefill and their decode steps)."""
        return self.rows / self.batches if self.batches else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        """Live rows per decode step: the batch size the forward passes actually had."""
        return self.tokens_generated / self.decode_steps if self.decode_steps else 0.0

    @property
    def prefill_share(self) -> float:
        """Share of model time spent prefilling (including re-prefills after re-batching)."""
        total = self.prefill_s + self.decode_s
        return self.prefill_s / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            mean_batch_size=self.mean_batch_size,
            mean_tokens_per_step=self.mean_tokens_per_step,
            prefill_share=self.prefill_share,
        )
        return out


class BatchDecoder:
    """Runs rounds on one model; owned by the engine's worker thread."""

    def __init__(
        self,
        model: PreTrainedModel,
        pad_id: int,
        generator: torch.Generator,
        splice: bool = True,
        share_prefill: bool = True,
        prefix_cache_tokens: int = 0,
    ) -> None:
        self.model = model
        self.pad_id = pad_id
        self.generator = generator
        self.splice = splice  # turned off for good if the cache layers cannot be spliced
        self.share_prefill = share_prefill  # needs splicing too: a copied cache is a spliced one
        # finished requests' caches (needs splicing too: a continuation joins as a spliced row)
        keep = splice and prefix_cache_tokens
        self.prefixes = PrefixCache(prefix_cache_tokens) if keep else None
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        # transformers 5.2x renamed ``past_key_values`` to ``cache``; the GPU image has an older 5.x.
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.tokens_total = 0  # live count of generated tokens (read by other threads)
        self.live: LiveBatch | None = None

    def reset(self) -> None:
        """Forget the kept batch (after a pause that removed rows, a weight update, an error)."""
        self.live = None

    def forget_prefixes(self) -> None:
        """Drop the finished requests' caches (new weights make them wrong)."""
        if self.prefixes is not None:
            self.prefixes.clear()

    def _forward(self, ids, mask, positions, cache: DynamicCache) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,  # prefill needs only the last position's logits
            **{self.cache_kwarg: cache},
        )
        return out.logits[:, -1, :].float()

    def _prefill(self, slots: list[Slot], stats: RoundStats) -> tuple[LiveBatch, torch.Tensor]:
        """The batch of ``slots`` (in any order: ``live.rows`` says which) and its logits."""
        hits = []
        if self.prefixes is not None:
            taken = [(s, self.prefixes.take(s.request.input_ids + s.output)) for s in slots]
            hits = [(s, prefix) for s, prefix in taken if prefix is not None]
            slots = [s for s, prefix in taken if prefix is None]
        if not hits:
            return self._prefill_all(slots, stats)
        live, logits = self._prefill_continuations(hits, stats)
        if slots:
            rest, rest_logits = self._prefill_all(slots, stats)
            rest.extend(live)
            live, logits = rest, torch.cat([rest_logits, logits], dim=0)
        return live, logits

    def _prefill_continuations(
        self, hits: list, stats: RoundStats
    ) -> tuple[LiveBatch, torch.Tensor]:
        """Rows that continue a cached prefix: each row's cache is the prefix (left-padded to
        the longest), then a gap of padding, then its new tokens (left-padded to the longest)."""
        start = time.perf_counter()
        suffixes = [(s.request.input_ids + s.output)[len(p) :] for s, p in hits]
        cached = max(len(p) for _, p in hits)
        ids, new_mask, _ = left_pad(suffixes, self.pad_id, self.device)
        old_mask = torch.zeros((len(hits), cached), dtype=torch.long, device=self.device)
        positions = torch.zeros_like(ids)
        for row, ((_, prefix), suffix) in enumerate(zip(hits, suffixes, strict=True)):
            old_mask[row, cached - len(prefix) :] = 1
            positions[row, ids.shape[1] - len(suffix) :] = torch.arange(
                len(prefix), len(prefix) + len(suffix), device=self.device
            )
        cache = growing_cache(self.model.config)
        for layer, per_row in enumerate(zip(*(p.layers for _, p in hits), strict=True)):
            # each row's prefix right-aligned at column ``cached``, zeros before it; the room
            # after it takes the new tokens (and the first decode steps) without a copy
            k0, v0 = per_row[0]
            keys = roomy_buffer(k0[None], len(hits), cached + ids.shape[1])
            values = roomy_buffer(v0[None], len(hits), cached + ids.shape[1])
            for row, (k, v) in enumerate(per_row):
                pad = cached - k.shape[-2]
                keys[row, :, :pad], values[row, :, :pad] = 0, 0
                keys[row, :, pad:cached], values[row, :, pad:cached] = k, v
            adopt_layer(cache, layer, keys, values, cached)
        mask = torch.cat([old_mask, new_mask], dim=1)
        logits = self._forward(ids, mask, positions, cache)
        stats.prefill_tokens += sum(map(len, suffixes))
        stats.prefix_cached_tokens += sum(len(p) for _, p in hits)
        stats.prefill_s += time.perf_counter() - start
        return LiveBatch([s for s, _ in hits], cache, mask, positions[:, -1:]), logits

    def _prefill_all(self, slots: list[Slot], stats: RoundStats) -> tuple[LiveBatch, torch.Tensor]:
        start = time.perf_counter()
        sequences = [s.request.input_ids + s.output for s in slots]
        # a slot with output was prefilled before: this is the cost of not splicing
        stats.reprefilled_tokens += sum(
            len(seq) for seq, s in zip(sequences, slots, strict=True) if s.output
        )
        distinct: dict[tuple[int, ...], int] = {}
        member_of = [distinct.setdefault(tuple(seq), len(distinct)) for seq in sequences]
        shared = self.splice and self.share_prefill and len(distinct) < len(sequences)
        if shared:
            firsts = {index: row for row, index in reversed(list(enumerate(member_of)))}
            computed = [sequences[firsts[i]] for i in range(len(distinct))]
            leaders = [slots[firsts[i]] for i in range(len(distinct))]
        else:
            computed, leaders = sequences, slots
        n_computed = sum(len(seq) for seq in computed)
        stats.prefill_tokens += n_computed
        ids, mask, positions = left_pad(computed, self.pad_id, self.device)
        cache = growing_cache(self.model.config)
        logits = self._forward(ids, mask, positions, cache)
        live = LiveBatch(leaders, cache, mask, positions[:, -1:])
        if self.splice and not splice_supported(cache):
            logger.info("cache layers cannot be spliced: re-prefilling between rounds")
            self.splice = False
            self.prefixes = None  # a continuation would join as a spliced row too
            if shared:  # the cache cannot be copied row by row either: prefill every row
                stats.prefill_tokens -= n_computed
                stats.prefill_s += time.perf_counter() - start
                return self._prefill_all(slots, stats)
        if shared:
            live.select(member_of)  # each member gets its own copy of its group's cache
            live.rows = list(slots)
            logits = logits[torch.tensor(member_of, device=logits.device)]
            stats.shared_prefill_tokens += sum(map(len, sequences)) - n_computed
        stats.prefill_s += time.perf_counter() - start
        return live, logits

    def _step(self, live: LiveBatch, tokens: torch.Tensor, stats: RoundStats) -> torch.Tensor:
        start = time.perf_counter()
        logits = self._forward(*live.advance(tokens), live.cache)
        stats.decode_s += time.perf_counter() - start
        return logits

    def _start_round(self, slots: list[Slot], stats: RoundStats) -> tuple[LiveBatch, torch.Tensor]:
        """The batch for this round and its next-token logits: splice if we can, else prefill."""
        live, self.live = self.live, None
        if live is None or not self.splice:
            return self._prefill(slots, stats)
        wanted = {id(s) for s in slots}
        keep = [i for i, s in enumerate(live.rows) if s.finish is None and id(s) in wanted]
        if not keep:
            return self._prefill(slots, stats)
        known = {id(s) for s in live.rows}
        new = [s for s in slots if id(s) not in known]
        live.select(keep)
        assert live.pending is not None
        logits = self._step(live, live.pending, stats)
        if new:
            joining, new_logits = self._prefill(new, stats)
            live.extend(joining)
            logits = torch.cat([logits, new_logits], dim=0)
        return live, logits

    def run(
        self,
        slots: list[Slot],
        version: int,
        should_stop: Callable[[int, int, int], bool],
        on_finish: Callable[[Slot], None],
    ) -> RoundStats:
        """Generate for ``slots`` until all finish or ``should_stop(steps, n_open, n_rows)``.

        Each finished slot is handed to ``on_finish`` at once, so callers do not wait for the
        slowest row of the round.
        """
        stats = RoundStats(rows=len(slots))
        live, logits = self._start_round(slots, stats)
        params = [s.request.sampling for s in live.rows]
        sampling = BatchSampling.from_params(params, self.vocab_size, self.device)
        rows = live.rows
        penalties = RoundPenalties.build(
            params, [s.history() for s in rows], [s.held_ids for s in rows],
            [len(s.output) for s in rows], self.vocab_size, self.device,
        )  # fmt: skip
        while True:
            start = time.perf_counter()
            positions = self._positions(live.rows)
            if penalties is not None:
                logits = penalties.apply(logits)
            tokens, logprobs = sample_next(logits, sampling, self.generator, positions)
            if penalties is not None:
                penalties.record(tokens)
            n_open, finished = self._record(
                live.rows, tokens.tolist(), logprobs.tolist(), version, stats
            )
            if finished and self.prefixes is not None:
                try:  # before the caller can send its next call
                    self._remember(live, finished)
                except Exception:  # e.g. out of memory: the cache is an optimisation
                    logger.exception("could not keep finished requests' caches: dropping them")
                    self.prefixes.clear()
            for row in finished:
                on_finish(live.rows[row])
            stats.decode_s += time.perf_counter() - start
            stats.decode_steps += 1
            if n_open == 0:
                return stats
            if should_stop(stats.decode_steps, n_open, len(live)):
                live.pending = tokens
                self.live = live
                return stats
            logits = self._step(live, tokens, stats)

    def _positions(self, slots: list[Slot]) -> torch.Tensor:
        """Each row's sequence length now: what a seeded row's noise is keyed on.

        Counted from the request as submitted plus its output so far, so a request resubmitted
        as prompt + partial output (``generate_resuming``) sees the same positions.
        """
        lengths = [len(s.request.input_ids) + len(s.output) for s in slots]
        return torch.tensor(lengths, dtype=torch.long, device=self.device)

    def _remember(self, live: LiveBatch, rows: list[int]) -> None:
        """Keep the cache of rows that just finished: it holds every token they read."""
        assert self.prefixes is not None
        layers = [(layer.keys, layer.values) for layer in live.cache.layers]
        for row in rows:
            slot = live.rows[row]
            tokens = slot.request.input_ids + slot.output[:-1]  # the last token was never read
            columns = live.mask[row].nonzero()[:, 0]
            if len(columns) != len(tokens):
                continue  # not what this row's cache holds: keep nothing rather than guess
            # index_select copies: the entry does not pin the batch's cache
            self.prefixes.store(
                tokens, [(k[row].index_select(1, columns), v[row].index_select(1, columns))
                         for k, v in layers],
            )  # fmt: skip

    def _record(self, slots, tokens, logprobs, version, stats: RoundStats) -> tuple[int, list[int]]:
        """Append each open row's token; returns how many rows are still open and which rows
        finished with this token."""
        n_open = 0
        finished = []
        for row, (slot, token, logprob) in enumerate(zip(slots, tokens, logprobs, strict=True)):
            if slot.finish is None and slot.cancelled:
                slot.finish = "abort"  # nobody is waiting: stop spending compute on it
            if slot.finish is not None:
                continue
            slot.append(token, logprob, version)
            stats.tokens += 1
            self.tokens_total += 1
            if slot.finish is not None:
                finished.append(row)
            else:
                n_open += 1
        return n_open, finished
