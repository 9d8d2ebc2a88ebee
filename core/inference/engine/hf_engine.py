"""An in-process inference engine on a Hugging Face causal LM, with step-wise batching.

A dedicated worker thread owns the model. ``agenerate`` (a coroutine, possibly on another
thread's event loop) queues a request and awaits an asyncio future that the worker resolves with
``loop.call_soon_threadsafe``. The worker runs *rounds* (see :mod:`core.inference.engine.batching`):
the running requests plus up to ``max_batch_size`` waiting ones decode together, one forward per
step for the whole batch, each finished request answered at once. Waiting requests join in
order of their ``priority`` (the rollout executor's: oldest group first), then arrival. After
``chunk_tokens`` steps a round ends when requests wait to join or enough rows are done; the next
round keeps the survivors' KV cache and prefills only the newcomers (or, where caches cannot be
spliced, re-prefills everyone from prompt + generated-so-far). A request that continues a finished one
(an agent's next call) prefills only its new tokens, from the finished request's KV cache
(``prefix_cache_tokens`` of them kept, cleared when new weights load).

Pausing (before a weight update) ends the round after the current forward step. In ``abort``
mode every in-flight request returns ``stop_reason="abort"`` with its partial tokens (what
:func:`~core.inference.api.generate_resuming` expects); ``retract`` puts them back in the queue to
continue after resume under the new weights (re-prefilled); ``hold`` keeps them in the batch,
to go on decoding after resume: on their KV cache as it is when a weight load keeps it
(``keep_kv_on_update``, PipelineRL's in-flight update), else re-prefilled under the new weights
like ``retract``. ``drain`` lets them finish first. Requests that arrive while paused wait for
:meth:`HFEngine.resume`.

A bad request fails alone. ``agenerate`` checks token ids (integers inside the vocabulary) and
sampling parameters before queueing. If a round still raises, each of its unfinished requests is
retried for one step on its own: a request that fails alone gets :class:`GenerationError`, the
others continue (their next round re-prefills them). On CUDA some errors (a device-side assert)
break the whole context instead: those are what the checks before queueing are for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import heapq
import itertools
import logging
import operator
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from core.inference.api import GenerationRequest, GenerationResponse, WeightSource
from core.inference.engine.batching import BatchDecoder, EngineStats, RoundStats, Slot
from core.inference.engine.sampling import validate_sampling
from core.inference.engine.weights import load_weights, read_state_dict
from core.inference.stop_strings import tail_matches

logger = logging.getLogger(__name__)

PauseMode = Literal["abort", "retract", "hold", "drain"]
# Finished requests' KV kept for continuations: 128k tokens is 256 MB for the tiny preset (4
# layers x 2 KV heads x 32 dims, float32), 1.6 GB for Qwen2.5-0.5B in bfloat16 (24 x 2 x 64).
DEFAULT_PREFIX_CACHE_TOKENS = 131_072
# A stronger mode overrides a weaker one when pause() is called again while paused.
_PAUSE_STRENGTH = {"drain": 0, "hold": 1, "retract": 2, "abort": 3}


class GenerationError(RuntimeError):
    """Generating for one request failed inside the engine (the request itself may be fine)."""


class WaitQueue:
    """Requests waiting for a batch row: the smallest ``(priority, arrival)`` first.

    With the rollout executor's priorities (each group's submission number) the oldest groups'
    calls go first whenever more calls wait than the batch has rows: they finish sooner and are
    trained on fresher, instead of every group in flight advancing together and all of them
    reaching the staleness bound at once. Equal priorities keep arrival order; a request put
    back (a retracting pause) keeps its place.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Slot]] = []
        self._arrivals = itertools.count()

    def push(self, slot: Slot) -> None:
        if slot.arrival is None:
            slot.arrival = next(self._arrivals)
        heapq.heappush(self._heap, (slot.request.priority, slot.arrival, slot))

    def pop(self) -> Slot:
        return heapq.heappop(self._heap)[2]

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Slot]:
        return (slot for _, _, slot in sorted(self._heap))


def _stop_after_one_step(steps: int, n_open: int, n_rows: int) -> bool:
    return True


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _call_in_loop(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass


class HFEngine:
    """The :class:`~core.inference.api.InferenceEngine` protocol on a local HF model (CPU or CUDA)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        eos_token_ids: Iterable[int] | int | None = None,
        pad_token_id: int | None = None,
        max_batch_size: int = 128,
        chunk_tokens: int = 16,
        seed: int = 0,
        version: int = 0,
        splice: bool = True,
        share_prefill: bool = True,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        keep_kv_on_update: bool = False,
        name: str = "hf-engine",
    ) -> None:
        if max_batch_size < 1 or chunk_tokens < 1:
            raise ValueError("max_batch_size and chunk_tokens must be >= 1")
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.eos_token_ids = _eos_ids(eos_token_ids, tokenizer)
        self.tokenizer = tokenizer  # decodes the output tails that stop strings are matched on
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self._decoder = BatchDecoder(
            model, pad_token_id or 0, generator, splice=splice, share_prefill=share_prefill,
            prefix_cache_tokens=prefix_cache_tokens,
        )  # fmt: skip
        self.max_batch_size = max_batch_size
        self.chunk_tokens = chunk_tokens
        self.keep_kv_on_update = keep_kv_on_update  # see inference.kv_after_update
        self.stats = EngineStats()
        self._version = version
        self._cond = threading.Condition()
        self._model_lock = threading.Lock()  # held by a round or by a weight load
        self._waiting = WaitQueue()
        self._running: list[Slot] = []
        self._pause_mode: PauseMode | None = None
        self._idle_acks: list[cf.Future] = []
        self._resume_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        device: str | None = None,
        max_batch_size: int = 128,
        chunk_tokens: int = 16,
        seed: int = 0,
        torch_threads: int | None = None,
        attn_implementation: str = "sdpa",
        splice: bool = True,
        share_prefill: bool = True,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        keep_kv_on_update: bool = False,
        version: int = 0,
    ) -> HFEngine:
        """Load model (and tokenizer, for eos/pad ids, if the folder has one) from ``model_dir``.

        ``torch_threads`` sets torch's *process-wide* intra-op thread count. ``sdpa`` on CPU loads
        as :data:`~core.models.attention.GROUPED_SDPA` (no copies of grouped key/value heads).
        """
        from core.models import load_model, load_tokenizer  # heavy imports only when used
        from core.models.attention import inference_attention

        if torch_threads:
            torch.set_num_threads(torch_threads)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        attention = inference_attention(attn_implementation, device)
        model = load_model(model_dir, dtype=dtype, attn_implementation=attention)
        model.to(device)
        try:
            tokenizer = load_tokenizer(model_dir)
        except (OSError, ValueError):
            tokenizer = None
        # HF generate stops on generation_config's eos ids; chat models often list several.
        eos = model.generation_config.eos_token_id
        eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        return cls(
            model, tokenizer, eos_token_ids=eos_ids, pad_token_id=model.config.pad_token_id,
            max_batch_size=max_batch_size, chunk_tokens=chunk_tokens, seed=seed, splice=splice,
            share_prefill=share_prefill, prefix_cache_tokens=prefix_cache_tokens, version=version,
            keep_kv_on_update=keep_kv_on_update,
        )  # fmt: skip

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        """Token ids the model can read and write: ``[0, vocab_size)``."""
        rows = self.model.get_input_embeddings().weight.shape[0]
        return int(min(rows, self._decoder.vocab_size))

    @property
    def context_length(self) -> int | None:
        """The model's ``max_position_embeddings`` (None if its config has none)."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def paused(self) -> bool:
        return self._pause_mode is not None

    @property
    def tokens_generated(self) -> int:
        """Tokens generated so far, counted live (``stats`` is updated once per round)."""
        return self._decoder.tokens_total

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return sum(1 for s in self._running if s.finish is None)

    def _stop_check(self, stops: list[str]) -> Callable[[list[int]], bool] | None:
        """The per-token test for ``stops`` (None without any); they need the tokenizer."""
        if not stops:
            return None
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise ValueError("stop: stop strings need the engine's tokenizer; this engine has none")
        decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
        return functools.partial(tail_matches, decode, stops=list(stops))

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        """Generate for ``request``; ``ValueError`` for bad ids/sampling (nothing queued),
        :class:`GenerationError` if the model fails on this request."""
        self._check_ids(request.input_ids, "input_ids")
        self._check_ids(request.sampling.stop_token_ids, "stop_token_ids", allow_empty=True)
        self._check_ids(list(request.sampling.logit_bias), "logit_bias", allow_empty=True)
        if not 0 <= request.resumed_tokens <= len(request.input_ids):
            raise ValueError(
                f"resumed_tokens={request.resumed_tokens} must be in [0, len(input_ids)]"
            )
        validate_sampling(request.sampling)
        stop_check = self._stop_check(request.sampling.stop)
        if request.sampling.max_new_tokens <= 0:
            return GenerationResponse([], [], [], "length")
        loop = asyncio.get_running_loop()
        ends = frozenset(request.sampling.stop_token_ids) | self.eos_token_ids
        slot = Slot(
            request=request,
            stop_ids=frozenset() if request.sampling.ignore_eos else ends,  # as SGLang's
            held_ids=ends,
            stop_check=stop_check,
            loop=loop,
            future=loop.create_future(),
        )
        slot.future.add_done_callback(slot.on_future_done)
        with self._cond:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._waiting.push(slot)
            self._cond.notify_all()
        return await slot.future

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Pause; returns once no forward pass is running and in-flight requests are settled."""
        if mode not in _PAUSE_STRENGTH:
            raise ValueError(f"pause mode {mode!r} is not one of {sorted(_PAUSE_STRENGTH)}")
        with self._cond:
            current = self._pause_mode
            if current is None or _PAUSE_STRENGTH[mode] > _PAUSE_STRENGTH[current]:
                self._pause_mode = mode
        await self.wait_idle()

    async def resume(self) -> None:
        with self._cond:
            self._pause_mode = None
            waiters, self._resume_waiters = self._resume_waiters, []
            self._cond.notify_all()
        for loop, future in waiters:
            _call_in_loop(loop, _set_result, future, None)

    async def wait_until_resumed(self) -> None:
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._pause_mode is None:
                return
            future = loop.create_future()
            self._resume_waiters.append((loop, future))
        await future

    async def update_weights(self, source: WeightSource, version: int) -> None:
        if not self.paused:
            raise RuntimeError("update_weights needs a paused engine: call pause() first")
        await self.wait_idle()
        state = await asyncio.to_thread(read_state_dict, source)
        await asyncio.to_thread(self._load, state, version)
        logger.info("weights updated to version %d", version)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the worker; requests still queued or running fail with ``RuntimeError``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():  # else a round still holds the model: leave it be
            self._decoder.forget_prefixes()  # free the kept KV caches now, not with the engine
        with self._cond:
            pending = list(self._waiting) + [s for s in self._running if s.finish is None]
            self._waiting.clear()
            self._running = []
            acks, self._idle_acks = self._idle_acks, []
        for slot in pending:
            _call_in_loop(slot.loop, _set_exception, slot.future, RuntimeError("engine closed"))
        for ack in acks:
            ack.set_result(None)

    def __enter__(self) -> HFEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _check_ids(self, ids: list[int], name: str, allow_empty: bool = False) -> None:
        """Integers (not floats or bools) inside the vocabulary: an id outside it would index
        past the embedding and fail the whole batch (on CUDA, the whole process)."""
        if not ids and not allow_empty:
            raise ValueError(f"{name} must not be empty")
        vocab = self.vocab_size
        for i, token in enumerate(ids):
            if isinstance(token, bool | float):
                raise ValueError(f"{name}[{i}]={token!r} is not an integer token id")
            try:
                value = operator.index(token)
            except TypeError:
                raise ValueError(f"{name}[{i}]={token!r} is not an integer token id") from None
            if not 0 <= value < vocab:
                raise ValueError(f"{name}[{i}]={value} is outside the vocabulary [0, {vocab})")

    def _load(self, state, version: int) -> None:
        with self._model_lock:
            load_weights(self.model, state)
            if not self.keep_kv_on_update:  # else requests go on with it (PipelineRL)
                self._decoder.reset()  # a kept KV cache was computed with the old weights
                self._decoder.forget_prefixes()
            # Set inside the lock: a round started right after sees new weights *and* version.
            self._version = version

    async def wait_idle(self) -> None:
        """Return once the worker is between rounds and will not start another: nothing is
        queued or running, or the engine is paused.

        Requests resolve as they finish, inside a round; ``stats`` counts a round when it ends.
        So a caller that reads ``stats`` right after its requests return can miss the last
        round: wait for this first.
        """
        ack: cf.Future = cf.Future()
        with self._cond:
            if self._closed:
                return
            self._idle_acks.append(ack)
            self._cond.notify_all()
        await asyncio.wrap_future(ack)

    def _worker(self) -> None:
        with torch.inference_mode():  # grad mode is per thread: set it in the worker itself
            while (batch := self._next_batch()) is not None:
                self._end_round(batch, self._run_round(batch))

    def _run_round(self, batch: list[Slot]) -> RoundStats | None:
        try:
            with self._model_lock:
                return self._decoder.run(batch, self._version, self._should_stop, self._resolve)
        except Exception:  # keep serving: find the request(s) that fail on their own
            logger.exception("generation round of %d requests failed", len(batch))
            self._decoder.reset()
            return self._isolate(batch)

    def _isolate(self, batch: list[Slot]) -> RoundStats:
        """After a failed round: one step for each unfinished request alone. One that fails
        alone fails (only it); the others keep their tokens and go on in the next round."""
        total = RoundStats()
        for slot in batch:
            if slot.finish is not None or slot.cancelled:
                continue
            try:
                with self._model_lock:
                    total.merge(
                        self._decoder.run(
                            [slot], self._version, _stop_after_one_step, self._resolve
                        )
                    )
            except Exception as exc:
                logger.warning("request %s fails on its own: %r", slot.request.rid, exc)
                slot.finish = "abort"
                error = GenerationError(f"generation failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                _call_in_loop(slot.loop, _set_exception, slot.future, error)
            finally:
                self._decoder.reset()  # the next round re-prefills the survivors together
        return total

    def _next_batch(self) -> list[Slot] | None:
        with self._cond:
            while not self._closed:
                self._running = [s for s in self._running if s.finish is None]
                mode = self._pause_mode
                if mode is None:
                    self._admit()
                elif not (mode == "drain" and self._running):
                    self._ack_idle()
                    self._cond.wait()
                    continue
                if self._running:
                    return list(self._running)
                self._ack_idle()
                self._cond.wait()
            return None

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_batch_size:
            slot = self._waiting.pop()
            if not slot.cancelled:
                self._running.append(slot)

    def _ack_idle(self) -> None:
        acks, self._idle_acks = self._idle_acks, []
        for ack in acks:
            ack.set_result(None)

    def _should_stop(self, steps: int, n_open: int, n_rows: int) -> bool:
        """End the round? Read without the lock: a stale answer only shifts it by one step.

        With cache splicing, a new round costs only the newcomers' prefill (and a cache copy to
        drop finished rows), so after ``chunk_tokens`` steps we admit whoever waits. Without it,
        every surviving row is re-prefilled, so we end the round only when that pays: the batch
        grows by a quarter (or requests waited ``4 * chunk_tokens`` steps), or half the rows
        are finished dead weight.
        """
        mode = self._pause_mode
        if mode in ("abort", "retract", "hold") or self._closed:
            return True
        if mode == "drain" or steps < self.chunk_tokens:
            return False
        admissible = min(len(self._waiting), self.max_batch_size - n_open)
        finished = n_rows - n_open
        if self._decoder.splice:
            return admissible > 0 or 4 * finished >= n_rows
        if admissible > 0 and (4 * admissible >= n_open or steps >= 4 * self.chunk_tokens):
            return True
        return 2 * finished >= n_rows

    def _resolve(self, slot: Slot) -> None:
        if slot.cancelled:
            return
        if slot.finish == "abort":
            self.stats.aborted += 1
        self.stats.requests_served += 1
        _call_in_loop(slot.loop, _set_result, slot.future, slot.response())

    def _end_round(self, batch: list[Slot], stats: RoundStats | None) -> None:
        with self._cond:
            if stats is not None:
                self.stats.add(stats)
            unfinished = [s for s in batch if s.finish is None]
            if self._pause_mode in ("abort", "retract"):
                # The kept KV cache goes: its rows leave now, or come back after new weights.
                self._decoder.reset()
            if self._pause_mode == "abort":
                for slot in unfinished:
                    slot.finish = "abort"
                    self._resolve(slot)
            elif self._pause_mode == "retract":
                for slot in unfinished:
                    slot.n_interrupts += 1
                    self._waiting.push(slot)  # back in its old place
                self._running = []
            elif self._pause_mode == "hold":  # they stay running, to go on after resume
                for slot in unfinished:
                    slot.n_interrupts += 1


def _eos_ids(
    eos_token_ids: Iterable[int] | int | None, tokenizer: PreTrainedTokenizerBase | None
) -> frozenset[int]:
    if eos_token_ids is None and tokenizer is not None and tokenizer.eos_token_id is not None:
        eos_token_ids = tokenizer.eos_token_id
    if eos_token_ids is None:
        return frozenset()
    if isinstance(eos_token_ids, int):
        return frozenset({eos_token_ids})
    return frozenset(int(i) for i in eos_token_ids)
