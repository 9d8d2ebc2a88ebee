"""The inference-engine contract shared by the in-process engine and the HTTP clients.

An engine turns token ids into token ids. Every generated token carries the log-probability it
was sampled with and the weight *version* that produced it, because an interrupted request can
mix versions (AReaL: staleness is measured from a sample's oldest token).

``agenerate`` returns ``stop_reason="abort"`` with the tokens produced so far when the engine is
paused mid-request (a weight update is coming). :func:`generate_resuming` turns that into one
complete response: it waits for the engine to resume and resubmits prompt + partial output with
the remaining budget, so the resumed tokens are stamped with the new version. The resubmission
keeps every sampling parameter, the seed included: a seeded request continues the same random
stream, because its noise is keyed on the sequence position, which prompt + partial output keeps.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

StopReason = Literal["stop", "length", "abort"]

# An abort that no pause or weight update explains (a server that aborted the request on its
# own) is retried after a growing wait, at most this many times in a row without a new token.
MAX_UNEXPLAINED_ABORTS = 5
UNEXPLAINED_ABORT_BACKOFF_S = 0.2
# The weight group a distributed update uses when a request names none (SGLang's default).
DEFAULT_GROUP_NAME = "weight_update_group"

# The priority of requests made in this task (and the tasks it starts) unless they set their own:
# the rollout executor sets it to each group's submission number, so an agent's calls carry their
# group's age without passing it along.
request_priority: ContextVar[int] = ContextVar("request_priority", default=0)


@dataclass
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy decoding.

    ``seed``: per-request sampling seed: with a seed, the token at each position depends only on
    (seed, position, logits) — not on batching, other requests, or interruptions; None = the
    engine's own generator. Any int works (taken mod 2**64). HTTP clients send it as SGLang's
    ``sampling_seed`` / vLLM's ``seed``; each server has its own seeded sampler. "Logits" are the
    processed ones below: with penalties they are a function of the request's own output so far,
    which an interruption keeps (:attr:`GenerationRequest.resumed_tokens`).

    The rest follow SGLang's ``sampling_params`` (``sglang/srt/sampling/sampling_params.py``;
    :mod:`core.inference.engine.penalties` and :mod:`core.inference.engine.sampling` cite the details), in
    SGLang's order: the model's logits minus ``frequency_penalty`` x (times a token was
    generated) and ``presence_penalty`` if it was, stop tokens masked while fewer than
    ``min_new_tokens`` are out, ``repetition_penalty`` on generated tokens (a positive logit
    divided, a negative one multiplied), plus ``logit_bias``; then temperature; then top-k,
    top-p and ``min_p`` (drop tokens below ``min_p`` x the top token's probability).
    ``ignore_eos``: end-of-sequence and ``stop_token_ids`` no longer end generation (stop strings
    still do). The defaults change nothing.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # stop strings: core.inference.stop_strings
    seed: int | None = None  # see above: per-request, position-keyed; None = engine's generator
    min_p: float = 0.0  # 0 = off
    frequency_penalty: float = 0.0  # over generated tokens, per occurrence
    presence_penalty: float = 0.0  # over generated tokens, once
    repetition_penalty: float = 1.0  # 1 = off
    min_new_tokens: int = 0  # stop tokens and eos cannot be sampled before this many
    ignore_eos: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit

    @classmethod
    def of(cls, settings: Any) -> SamplingParams:
        """The parameters a run samples rollouts with: the config's ``sampling`` section (its
        ``max_new_tokens``, ``temperature``, ``top_p`` and ``top_k``)."""
        return cls(settings.max_new_tokens, settings.temperature, settings.top_p, settings.top_k)


@dataclass
class GenerationRequest:
    """Prompt token ids and sampling parameters; ``rid`` identifies the request across resumes.

    ``session`` names the conversation a request continues (an agent episode's calls share one):
    clients over several servers send a session's requests to one server, whose prefix cache
    holds the conversation so far. Empty = a request on its own.

    ``priority``: when more requests wait than the in-process engine has batch rows free, the
    smaller values go first (then the earlier arrivals). Defaults to :data:`request_priority`.

    ``resumed_tokens``: how many of the last ``input_ids`` this request generated itself before
    an interruption (:func:`generate_resuming` resubmits them as prompt): the in-process engine
    counts them as output for the penalties, so a resumed request is penalised as if it had not
    been interrupted. Remote engines have no such field: there penalties restart at a resume.
    """

    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    session: str = ""
    priority: int = field(default_factory=request_priority.get)
    resumed_tokens: int = 0


@dataclass
class GenerationResponse:
    """Generated tokens with per-token behaviour logprobs and weight versions."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    stop_reason: StopReason
    # how many times a pause for a weight update interrupted the request: resubmitted after an
    # abort (``generate_resuming``), or retracted or held inside the engine
    n_resumes: int = 0

    def __post_init__(self) -> None:
        assert len(self.output_ids) == len(self.logprobs) == len(self.versions), "ragged response"


@dataclass
class WeightSource:
    """Where new weights come from: a safetensors folder (path or URL) or an in-memory state dict."""

    path: str | None = None
    state_dict: dict | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.state_dict is None):
            raise ValueError("WeightSource needs exactly one of path or state_dict")


@runtime_checkable
class InferenceEngine(Protocol):
    """What the rollout side needs from an engine (in-process or remote)."""

    @property
    def version(self) -> int: ...

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        """Generate once; ``stop_reason == "abort"`` if paused mid-way (partial tokens kept)."""
        ...

    async def pause(self) -> None:
        """Stop generating: in-flight requests return ``abort``; new ones wait for resume."""
        ...

    async def resume(self) -> None: ...

    async def update_weights(self, source: WeightSource, version: int) -> None:
        """Load new weights (the engine must be paused) and stamp later tokens with ``version``."""
        ...

    async def wait_until_resumed(self) -> None:
        """Return once the engine accepts requests again (immediately if not paused)."""
        ...


async def generate_resuming(
    engine: InferenceEngine, request: GenerationRequest
) -> GenerationResponse:
    """Generate to completion across weight updates.

    On ``abort`` the partial output is kept with its own versions, and prompt + partial output is
    resubmitted with the remaining budget to the *same* engine once it resumes; its KV cache for
    the prefix is stale and gets recomputed (prefilled) under the new weights; ``min_new_tokens``
    shrinks by the output so far and ``resumed_tokens`` grows by it. ``n_resumes``
    counts those resubmissions plus the interruptions the engine handled itself (a request
    retracted or held across an update, reported in each part's own ``n_resumes``).

    An abort is explained when the engine is paused or its version moved since the part was
    sent. Any other abort (the server dropped the request by itself) is resubmitted after a
    wait that doubles each time, and :data:`MAX_UNEXPLAINED_ABORTS` of them in a row without a
    new token raise ``RuntimeError`` naming the request, instead of resubmitting forever.
    """
    output: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    budget = request.sampling.max_new_tokens
    n_resumes = 0
    unexplained = 0
    while True:
        sampling = replace(
            request.sampling,
            max_new_tokens=budget - len(output),
            min_new_tokens=max(0, request.sampling.min_new_tokens - len(output)),
        )
        sent_version = engine.version
        part = await engine.agenerate(
            GenerationRequest(
                request.input_ids + output,
                sampling,
                request.rid,
                request.session,
                request.priority,
                request.resumed_tokens + len(output),
            )  # fmt: skip
        )
        output += part.output_ids
        logprobs += part.logprobs
        versions += part.versions
        n_resumes += part.n_resumes
        if part.stop_reason != "abort":
            return GenerationResponse(output, logprobs, versions, part.stop_reason, n_resumes)
        if len(output) >= budget:
            return GenerationResponse(output, logprobs, versions, "length", n_resumes)
        n_resumes += 1
        explained = getattr(engine, "paused", False) or engine.version != sent_version
        unexplained = 0 if explained or part.output_ids else unexplained + 1
        if unexplained >= MAX_UNEXPLAINED_ABORTS:
            raise RuntimeError(
                f"request {request.rid}: aborted {unexplained} times in a row with no token and "
                "no pause or weight update to explain it (the server drops it)"
            )
        if unexplained:
            wait = UNEXPLAINED_ABORT_BACKOFF_S * 2 ** (unexplained - 1)
            logger.warning(
                "request %s aborted with no pause or weight update; resubmitting in %.1f s",
                request.rid, wait,
            )  # fmt: skip
            await asyncio.sleep(wait)
        await engine.wait_until_resumed()
