"""The engine protocol over vLLM's OpenAI-compatible ``/v1/completions`` with token-id prompts.

Requests carry ``"prompt": [token ids]``, ``logprobs: 0`` (the sampled token's logprob only) and
``return_tokens_as_token_ids`` so tokens come back as ``"token_id:123"`` strings, unambiguous
whatever the tokenizer. vLLM returns *raw* (pre-temperature) logprobs by default: launch it with
``--logprobs-mode processed_logprobs`` when sampling at a temperature other than 1, so the
behaviour logprobs match what the learner recomputes. ``SamplingParams.seed`` is sent as vLLM's
per-request ``seed`` (omitted when unset).

Stock vLLM has no HTTP weight-update or pause endpoint; deployments add their own (AReaL's vLLM
server, for one). Their paths are configurable: ``weight_update_path`` receives
``{"model_path", "weight_version"}``; with ``pause_path``/``resume_path`` unset, pausing holds new
requests in this client and *waits for the in-flight ones to finish* (never ``abort``), so no
request is still generating while new weights load. A response's tokens are stamped with the
version the client served when the request was sent: every token of it came from that version or
(with a pause endpoint that lets a request straddle an update) a newer one, so staleness is never
under-counted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from core.inference.api import (
    GenerationRequest,
    GenerationResponse,
    StopReason,
    WeightSource,
)
from core.inference.clients.http_client import HTTPEngineClient

logger = logging.getLogger(__name__)

_TOKEN_PREFIX = "token_id:"
_STOP_REASONS: dict[str, StopReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def completions_payload(request: GenerationRequest, model_name: str) -> dict[str, Any]:
    s = request.sampling
    payload: dict[str, Any] = {
        "model": model_name,
        "prompt": list(request.input_ids),
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,  # vLLM: -1 = off
        "stop_token_ids": list(s.stop_token_ids),
        "stop": list(s.stop),
        "include_stop_str_in_output": True,  # the trained tokens are the sampled ones
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "request_id": request.rid,
    }
    if s.seed is not None:  # absent = the server's own generator
        payload["seed"] = s.seed
    return payload


def parse_token(token: str) -> int:
    if not token.startswith(_TOKEN_PREFIX):
        raise ValueError(
            f"token {token!r} is not 'token_id:N' (return_tokens_as_token_ids ignored?)"
        )
    return int(token[len(_TOKEN_PREFIX) :])


def parse_completion(data: dict[str, Any], version: int) -> GenerationResponse:
    """``/v1/completions`` JSON -> :class:`GenerationResponse` (all tokens at ``version``)."""
    choice = data["choices"][0]
    logprobs = choice.get("logprobs") or {}
    tokens, token_logprobs = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if tokens is None or token_logprobs is None:
        raise ValueError("the completion carries no logprobs (request logprobs=0)")
    output_ids = [parse_token(t) for t in tokens]
    reason = choice.get("finish_reason")
    if reason not in _STOP_REASONS:
        raise ValueError(f"unexpected finish_reason {reason!r}")
    return GenerationResponse(
        output_ids,
        [float(lp) for lp in token_logprobs],
        [version] * len(output_ids),
        _STOP_REASONS[reason],
    )


class VLLMClient(HTTPEngineClient):
    """:class:`~core.inference.api.InferenceEngine` over vLLM OpenAI-compatible servers."""

    def __init__(
        self,
        addresses: list[str],
        *,
        model_name: str,
        weight_update_path: str = "/update_weights",
        pause_path: str | None = None,
        resume_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        """``kwargs``: :class:`HTTPEngineClient`'s (timeout_s, max_retries, retry_backoff_s,
        version, api_key)."""
        super().__init__(addresses, **kwargs)
        self.model_name = model_name
        self.weight_update_path = weight_update_path
        self.pause_path = pause_path
        self.resume_path = resume_path
        self._in_flight = 0
        self._drained = asyncio.Event()
        self._drained.set()

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        await self.wait_until_resumed()
        version = self._version  # at send: the oldest weights that can have made its tokens
        payload = completions_payload(request, self.model_name)
        self._in_flight += 1
        self._drained.clear()
        try:
            data = await self.on_server(
                request.rid,
                lambda url: self.request("POST", url + "/v1/completions", payload),
                prompt=request.input_ids,
                session=request.session,
            )
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._drained.set()
        resp = parse_completion(data, version)
        if resp.stop_reason != "abort":
            self.release(request.rid)
        return resp

    async def pause(self) -> None:
        """Hold new requests; abort the running ones through ``pause_path``, or without one
        wait until they have finished (stock vLLM cannot interrupt them)."""
        self._set_paused(True)
        if self.pause_path:
            await self.post_all(self.pause_path, {})
        else:
            await self._drained.wait()

    async def resume(self) -> None:
        if self.resume_path:
            await self.post_all(self.resume_path, {})
        self._set_paused(False)

    async def update_weights(
        self, source: WeightSource, version: int, *, reset: bool = False
    ) -> None:
        """Every server loads ``source.path`` (vLLM keeps no version order: ``reset`` is moot)."""
        if not self._paused:
            raise RuntimeError("update_weights needs a paused engine: call pause() first")
        if source.path is None:
            raise ValueError("vLLM servers load weights from disk: WeightSource(path=...)")
        await self.post_all(
            self.weight_update_path, {"model_path": source.path, "weight_version": str(version)}
        )
        self._version = version
        logger.info("%d vLLM server(s) now serve weight version %d", len(self.urls), version)
