"""Inference engines: the in-process HF engine, our SGLang-API server, and HTTP clients.

All implement :class:`~core.inference.api.InferenceEngine`: token ids in, token ids out, each
token with its behaviour logprob and the weight version that produced it.

The contract (``core.inference.api``) imports eagerly; the engines load torch, transformers and
aiohttp, so they are imported on first use (``from core.inference import HFEngine`` works), which
keeps ``import core.inference.api`` cheap for code that only needs the types.
"""

from __future__ import annotations

import importlib
from typing import Any

from core.inference.api import (
    GenerationRequest,
    GenerationResponse,
    InferenceEngine,
    SamplingParams,
    StopReason,
    WeightSource,
    generate_resuming,
)

_LAZY = {
    "EngineStats": "core.inference.engine.hf_engine",
    "GenerationError": "core.inference.engine.hf_engine",
    "HFEngine": "core.inference.engine.hf_engine",
    "PauseMode": "core.inference.engine.hf_engine",
    "ServerHandle": "core.inference.server.app",
    "create_app": "core.inference.server.app",
    "serve": "core.inference.server.app",
    "start_server": "core.inference.server.app",
    "SGLangClient": "core.inference.clients.sglang_client",
    "LaunchedServer": "core.inference.clients.sglang_launcher",
    "SGLangLaunchSpec": "core.inference.clients.sglang_launcher",
    "build_command": "core.inference.clients.sglang_launcher",
    "launch": "core.inference.clients.sglang_launcher",
    "VLLMClient": "core.inference.clients.vllm_client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GenerationRequest",
    "GenerationResponse",
    "InferenceEngine",
    "SamplingParams",
    "StopReason",
    "WeightSource",
    "generate_resuming",
    *_LAZY,
]
