"""The engine protocol over SGLang's native HTTP API (real SGLang or our ``core.inference.server``).

Weight versions: our server reports one per token (``meta_info["output_token_versions"]``). Real
SGLang does not; then every token of a response gets the server's ``meta_info["weight_version"]``
when it is an integer, else the version this client last set. That is exact as long as weights
only change while generation is paused, which is how :meth:`SGLangClient.update_weights` does it.

Launch real SGLang with ``--skip-tokenizer-init`` (we send token ids) and without
``SGLANG_RETURN_ORIGINAL_LOGPROB``, so returned logprobs are the temperature-scaled ones the
learner recomputes. ``SamplingParams.seed`` travels as SGLang's ``sampling_seed`` (omitted when
unset). Our server keys its noise on (seed, position); real SGLang has its own seeded sampler,
so the same seed reproduces tokens on the same kind of server, not across the two.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from core.inference.api import (
    DEFAULT_GROUP_NAME,
    GenerationRequest,
    GenerationResponse,
    SamplingParams,
    StopReason,
    WeightSource,
)
from core.inference.clients.http_client import HTTPEngineClient

logger = logging.getLogger(__name__)

_STOP_REASONS: dict[str, StopReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def sglang_sampling(params: SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # SGLang: -1 = off
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.stop:  # needs a server with its tokenizer (not --skip-tokenizer-init)
        out["stop"] = list(params.stop)
        out["no_stop_trim"] = True  # keep the string's tokens: they were sampled and are trained
    if params.seed is not None:  # absent = the server's own generator
        out["sampling_seed"] = params.seed
    # SGLang's own fields, sent only when set (their absence is SGLang's default)
    defaults = SamplingParams()
    for name in ("min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
                 "min_new_tokens", "ignore_eos"):  # fmt: skip
        if getattr(params, name) != getattr(defaults, name):
            out[name] = getattr(params, name)
    if params.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    return out


def _server_version(meta: dict[str, Any]) -> int | None:
    try:
        return int(meta["weight_version"])
    except (KeyError, TypeError, ValueError):  # absent, or SGLang's default "default"
        return None


def parse_generate_response(data: dict[str, Any], fallback_version: int) -> GenerationResponse:
    """SGLang ``/generate`` JSON -> :class:`GenerationResponse`."""
    meta = data["meta_info"]
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise ValueError("the server returned no output_token_logprobs (return_logprob ignored?)")
    # Token ids from the logprob triples: they always align with the logprobs.
    output_ids = [int(t[1]) for t in triples]
    logprobs = [float(t[0]) for t in triples]
    versions = meta.get("output_token_versions")
    if versions is None or len(versions) != len(output_ids):
        version = _server_version(meta)
        versions = [fallback_version if version is None else version] * len(output_ids)
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind not in _STOP_REASONS:
        raise ValueError(f"unexpected finish_reason {reason!r}")
    return GenerationResponse(output_ids, logprobs, [int(v) for v in versions], _STOP_REASONS[kind])


class SGLangClient(HTTPEngineClient):
    """:class:`~core.inference.api.InferenceEngine` over one or more SGLang-API servers."""

    def __init__(
        self,
        addresses: list[str],
        *,
        abort_on_update: bool = True,
        send_priority: bool = False,
        **kwargs: Any,
    ) -> None:
        """``send_priority``: send each request's ``priority`` (servers started with
        ``--enable-priority-scheduling --schedule-low-priority-values-first`` serve the smallest
        first; SGLang versions before the field refuse it). ``kwargs``:
        :class:`HTTPEngineClient`'s (timeout_s, max_retries, retry_backoff_s, version,
        api_key)."""
        super().__init__(addresses, **kwargs)
        self.abort_on_update = abort_on_update
        self.send_priority = send_priority

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        await self.wait_until_resumed()
        payload = {
            "input_ids": list(request.input_ids),
            "sampling_params": sglang_sampling(request.sampling),
            "return_logprob": True,
            "rid": request.rid,
        }
        if self.send_priority:
            payload["priority"] = request.priority
        data = await self.on_server(
            request.rid,
            lambda url: self.request("POST", url + "/generate", payload),
            prompt=request.input_ids,
            session=request.session,
        )
        resp = parse_generate_response(data, self._version)
        if resp.stop_reason != "abort":
            self.release(request.rid)
        return resp

    async def pause(self) -> None:
        """Hold new requests here and abort the servers' in-flight ones."""
        self._set_paused(True)
        await self.post_all("/pause_generation", {"mode": "abort"})

    async def resume(self) -> None:
        await self.post_all("/continue_generation", {})
        self._set_paused(False)

    async def update_weights(
        self, source: WeightSource, version: int, *, reset: bool = False
    ) -> None:
        """Every server loads ``source.path`` (a folder all servers can read) as ``version``;
        ``reset``: whatever version it served before (our server otherwise only moves forward)."""
        if not self._paused:
            raise RuntimeError("update_weights needs a paused engine: call pause() first")
        if source.path is None:
            raise ValueError("SGLang servers load weights from disk: WeightSource(path=...)")
        payload = {
            "model_path": source.path,
            "abort_all_requests": self.abort_on_update,
            "weight_version": str(version),
        }
        if reset:  # our server's extension; SGLang ignores unknown fields and version order
            payload["reset_version"] = True
        await self._update_all("/update_weights_from_disk", payload, version)

    # ------------------------------------------------------------ weights by broadcast

    async def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        group_name: str = DEFAULT_GROUP_NAME,
        backend: str = "nccl",
    ) -> None:
        """Server ``i`` joins ``group_name`` as rank ``1 + i`` of ``1 + n``; the caller joins as
        rank 0 meanwhile (:func:`~core.inference.weight_broadcast.open_group`, which listens on
        ``master_address:master_port``): each side's join returns once all have joined."""
        body = {"master_address": master_address, "master_port": master_port,
                "world_size": 1 + len(self.urls), "group_name": group_name, "backend": backend}  # fmt: skip
        results = await asyncio.gather(
            *(
                self.request(
                    "POST", url + "/init_weights_update_group", {**body, "rank_offset": 1 + i}
                )
                for i, url in enumerate(self.urls)
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def update_weights_distributed(
        self, metadata: dict[str, list], version: int, group_name: str = DEFAULT_GROUP_NAME
    ) -> None:
        """Every server receives the tensors ``metadata`` describes (``names``/``dtypes``/
        ``shapes``, from :func:`~core.inference.weight_broadcast.tensor_metadata`) as
        ``version``, while the caller broadcasts them in that order
        (:func:`~core.inference.weight_broadcast.broadcast_tensors`). If this raises, the
        caller's broadcast may wait for the group's timeout: close the group."""
        if not self._paused:
            raise RuntimeError("update_weights_distributed needs a paused engine: pause() first")
        payload = {
            **metadata,
            "group_name": group_name,
            "flush_cache": True,
            "abort_all_requests": self.abort_on_update,
            "weight_version": str(version),
        }
        await self._update_all("/update_weights_from_distributed", payload, version)

    async def _update_all(self, path: str, payload: dict[str, Any], version: int) -> None:
        """POST a weight update to every live server; all must succeed for ``version``."""
        results = await self.post_all(path, payload)
        failed = [r for r in results if not (isinstance(r, dict) and r.get("success"))]
        if failed:
            raise RuntimeError(f"weight update to version {version} failed: {failed}")
        self._version = version
        logger.info("%d server(s) now serve weight version %d", len(results), version)

    async def destroy_weight_group(self, group_name: str = DEFAULT_GROUP_NAME) -> None:
        await self.post_all("/destroy_weights_update_group", {"group_name": group_name})

    async def serves(self, source: WeightSource, version: int) -> bool:
        """Every server reports ``source.path`` as its model and ``version`` as its version."""
        if source.path is None:
            return False
        infos = await asyncio.gather(
            *(self.request("GET", u + "/get_model_info") for u in self.urls)
        )
        want = os.path.normpath(source.path)
        return all(
            _server_version(info) == version
            and os.path.normpath(str(info.get("model_path", ""))) == want
            for info in infos
        )

    async def server_versions(self) -> list[int | None]:
        """Each server's weight version (``None`` where it is not an integer)."""
        infos = await asyncio.gather(
            *(self.request("GET", u + "/get_model_info") for u in self.urls)
        )
        return [_server_version(info) for info in infos]
