"""``POST /generate``: SGLang's native generation endpoint on our engine (answers in its shape).

One answer per sample, as SGLang gives it: ``{"text", "output_ids", "meta_info"}`` with
``meta_info`` ``{"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
"weight_version", "e2e_latency", "output_token_logprobs"}``, ``output_token_logprobs`` as
``[logprob, token_id, text]`` triples (``text`` null unless ``return_text_in_logprobs``: then
each token decoded alone, special tokens kept, as SGLang's ``detokenize_logprob_tokens``) and
``finish_reason`` as ``{"type": "stop", "matched": id}`` / ``{"type": "length", "length": n}`` /
``{"type": "abort", "message": ...}``. Our extension: ``meta_info["output_token_versions"]``.
A batch (a list of prompts, or ``n > 1``) is answered with a list, prompt by prompt.

``text`` is there when the model folder has a tokenizer: the output decoded with the request's
``skip_special_tokens`` and ``spaces_between_special_tokens``, as SGLang's detokenizer does
(``tokenizer.decode(ids, skip_special_tokens=..., spaces_between_special_tokens=...)``). The
request is parsed by :mod:`core.inference.server.sglang_params`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from transformers import PreTrainedTokenizerBase

from core.inference.api import GenerationRequest, GenerationResponse
from core.inference.engine.hf_engine import GenerationError, HFEngine
from core.inference.server.sglang_params import GenerateBatch, TextOptions
from core.inference.server.validation import RequestError


def finish_reason(resp: GenerationResponse) -> dict[str, Any]:
    if resp.stop_reason == "stop":
        return {"type": "stop", "matched": resp.output_ids[-1]}
    if resp.stop_reason == "length":
        return {"type": "length", "length": len(resp.output_ids)}
    return {"type": "abort", "message": "generation paused for a weight update"}


def decode(tokenizer: PreTrainedTokenizerBase, ids: list[int], options: TextOptions) -> str:
    """The text of ``ids`` as SGLang's detokenizer writes it."""
    return tokenizer.decode(
        ids,
        skip_special_tokens=options.skip_special_tokens,
        spaces_between_special_tokens=options.spaces_between_special_tokens,
    )


def to_sglang(
    resp: GenerationResponse,
    rid: str,
    n_prompt: int,
    version: int,
    logprobs: bool,
    latency: float,
    token_texts: list[str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason(resp),
        "prompt_tokens": n_prompt,
        "completion_tokens": len(resp.output_ids),
        "cached_tokens": 0,
        "weight_version": str(version),
        "e2e_latency": latency,
        "output_token_versions": resp.versions,
    }
    if logprobs:
        texts = token_texts or [None] * len(resp.output_ids)
        meta["output_token_logprobs"] = [
            [lp, tok, text]
            for lp, tok, text in zip(resp.logprobs, resp.output_ids, texts, strict=True)
        ]
    return {"output_ids": resp.output_ids, "meta_info": meta}


async def generate_one(
    engine: HFEngine, batch: GenerateBatch, i: int, priority: int
) -> dict[str, Any]:
    """Sample ``i`` of ``batch``, answered as SGLang answers one."""
    rid = batch.rids[i] or uuid.uuid4().hex
    ids = batch.prompts[i]
    start = time.perf_counter()
    try:
        request = GenerationRequest(
            list(ids), batch.samplings[i], rid, session=batch.sessions[i], priority=priority
        )
        resp = await engine.agenerate(request)
    except GenerationError:
        raise
    except ValueError as exc:  # the engine's own checks (the server's should have caught it)
        raise RequestError("request", str(exc)) from None
    except RuntimeError as exc:  # closed
        raise RequestError("engine", str(exc), status=503) from None
    latency = time.perf_counter() - start
    tokenizer = engine.tokenizer
    token_texts = None
    if batch.return_text_in_logprobs and tokenizer is not None:  # SGLang: special tokens kept
        token_texts = tokenizer.batch_decode([[t] for t in resp.output_ids])
    answer = to_sglang(
        resp, rid, len(ids), engine.version, batch.return_logprob, latency, token_texts
    )
    if tokenizer is None:
        return answer
    return {"text": decode(tokenizer, resp.output_ids, batch.texts[i]), **answer}


async def generate_answers(
    engine: HFEngine, batch: GenerateBatch, priority_sign: int
) -> list[dict[str, Any]] | dict[str, Any]:
    """Every sample of ``batch`` at once; the engine serves the smallest priority first, so
    ``priority_sign`` (from the server's flags) turns SGLang's priorities into ours."""
    results = await asyncio.gather(
        *(
            generate_one(engine, batch, i, priority_sign * priority)
            for i, priority in enumerate(batch.priorities)
        ),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results if batch.batched else results[0]
