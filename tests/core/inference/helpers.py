"""Helpers shared by the inference tests (imported as ``tests.core.inference.helpers``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import torch

from core.inference.engine.hf_engine import HFEngine
from core.inference.server.app import ServerHandle, start_server

CORPUS = [
    f"Question: Finn has {a} beads and finds {b} more. How many now?\nAnswer: {a}+{b}={a + b}. #### {a + b}"
    for a in range(12)
    for b in range(12)
]
TIMEOUT_S = 60.0


def run(coro: Coroutine[Any, Any, Any], timeout_s: float = TIMEOUT_S) -> Any:
    """Run ``coro`` on a fresh event loop, failing instead of hanging."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def teacher_logprobs(
    model, prompt: list[int], output: list[int], temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / T)`` of a forward pass over prompt + output, at the output tokens."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    scaled = logits[len(prompt) - 1 : len(prompt) + len(output) - 1] / (temperature or 1.0)
    return torch.log_softmax(scaled, -1).gather(1, torch.tensor(output)[:, None]).squeeze(1)


def hf_greedy(model, tokenizer, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return out[0, len(prompt) :].tolist()


async def wait_for_tokens(engine: HFEngine, n: int, timeout_s: float = 30.0) -> None:
    """Until ``engine`` has generated ``n`` tokens (so a pause lands mid-generation)."""
    start = engine.tokens_generated
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while engine.tokens_generated - start < n:
        assert loop.time() < deadline, "engine made no progress"
        await asyncio.sleep(0.005)


class ServerThread:
    """Our SGLang-API server on its own event loop thread, like a separate process would be."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.handles: list[ServerHandle] = []

    def start(self, **kwargs: Any) -> ServerHandle:
        handle = asyncio.run_coroutine_threadsafe(start_server(**kwargs), self.loop).result(
            TIMEOUT_S
        )
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        for handle in self.handles:
            asyncio.run_coroutine_threadsafe(handle.stop(), self.loop).result(TIMEOUT_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT_S)
        self.loop.close()
