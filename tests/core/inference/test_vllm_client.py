"""The vLLM client against a small stand-in speaking the OpenAI completions shape.

vLLM cannot run here (CUDA-only wheels), so a tiny aiohttp app plays the server: it records what
the client sends and answers the way vLLM's ``/v1/completions`` does with
``return_tokens_as_token_ids``. It checks our request building and parsing, not vLLM itself.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from core.inference import api
from core.inference.api import (
    GenerationRequest,
    InferenceEngine,
    SamplingParams,
    WeightSource,
    generate_resuming,
)
from core.inference.clients.sglang_client import SGLangClient
from core.inference.clients.vllm_client import VLLMClient, parse_completion, parse_token
from tests.core.inference.helpers import run

pytestmark = pytest.mark.integration


class FakeVLLM:
    """Answers completions with ``prompt[-1] + 1, + 2, ...``; aborts once when told to."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.updates: list[dict] = []
        self.abort_next = False
        self.abort_always = False  # abort every request with no token (a server dropping them)
        self.delay_s = 0.0  # how long a completion takes
        self.events: list[str] = []  # "done" per completion, "update" per weight update

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        await asyncio.sleep(self.delay_s)
        self.events.append("done")
        n = body["max_tokens"]
        finish = "length"
        if self.abort_next:
            self.abort_next, n, finish = False, 2, "abort"
        if self.abort_always:
            n, finish = 0, "abort"
        ids = [body["prompt"][-1] + i + 1 for i in range(n)]
        return web.json_response({
            "id": "cmpl-1",
            "object": "text_completion",
            "model": body["model"],
            "choices": [{
                "index": 0,
                "text": "".join(f"<{i}>" for i in ids),
                "logprobs": {
                    "text_offset": list(range(n)),
                    "token_logprobs": [-0.5 * (i + 1) for i in range(n)],
                    "tokens": [f"token_id:{i}" for i in ids],
                    "top_logprobs": None,
                },
                "finish_reason": finish,
                "stop_reason": None,
            }],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n},
        })  # fmt: skip

    async def update(self, request: web.Request) -> web.Response:
        self.events.append("update")
        self.updates.append(await request.json())
        return web.json_response({"success": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/custom_update", self.update)
        return app


async def _serve(fake: FakeVLLM) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"127.0.0.1:{runner.addresses[0][1]}"


def test_request_building_and_parsing() -> None:
    fake = FakeVLLM()
    sampling = SamplingParams(max_new_tokens=4, temperature=0.7, top_p=0.9, stop_token_ids=[2])

    async def main():
        runner, address = await _serve(fake)
        try:
            async with VLLMClient([address], model_name="tiny") as client:
                return await client.agenerate(GenerationRequest([5, 6, 7], sampling, rid="x"))
        finally:
            await runner.cleanup()

    resp = run(main())
    assert resp.output_ids == [8, 9, 10, 11] and resp.stop_reason == "length"
    assert resp.logprobs == [-0.5, -1.0, -1.5, -2.0] and resp.versions == [0] * 4
    body = fake.bodies[0]
    assert body["prompt"] == [5, 6, 7] and body["model"] == "tiny"
    assert body["max_tokens"] == 4 and body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["top_k"] == -1 and body["stop_token_ids"] == [2]
    assert body["logprobs"] == 0 and body["return_tokens_as_token_ids"] is True
    assert body["skip_special_tokens"] is False


def test_abort_resume_and_weight_update_endpoint() -> None:
    fake = FakeVLLM()
    sampling = SamplingParams(max_new_tokens=5, temperature=1.0)

    async def main():
        runner, address = await _serve(fake)
        try:
            async with VLLMClient(
                [address], model_name="tiny", weight_update_path="/custom_update"
            ) as client:
                await client.pause()
                await client.update_weights(WeightSource(path="/ckpt/v3"), 3)
                await client.resume()
                fake.abort_next = True
                return await generate_resuming(client, GenerationRequest([1], sampling))
        finally:
            await runner.cleanup()

    resp = run(main())
    assert fake.updates == [{"model_path": "/ckpt/v3", "weight_version": "3"}]
    # an aborted first part, then the rest from prompt + partial output with the remaining budget
    assert resp.output_ids == [2, 3, 4, 5, 6] and resp.n_resumes == 1
    assert fake.bodies[1]["prompt"] == [1, 2, 3] and fake.bodies[1]["max_tokens"] == 3
    assert resp.versions == [3] * 5 and resp.stop_reason == "length"


def test_a_request_in_flight_across_a_weight_update_keeps_its_version() -> None:
    """Issue 32 #2: without a pause endpoint, pause() waits for the running request, the update
    follows it, and its tokens carry the version they were made with (they were stamped with
    the version current when the response arrived, after the update: v-1 labelled v)."""
    fake = FakeVLLM()
    fake.delay_s = 0.5

    async def main():
        runner, address = await _serve(fake)
        try:
            async with VLLMClient(
                [address], model_name="tiny", weight_update_path="/custom_update", version=2
            ) as client:
                running = asyncio.ensure_future(
                    client.agenerate(GenerationRequest([1], SamplingParams(max_new_tokens=3)))
                )
                await asyncio.sleep(0.1)  # the request is on the server
                await client.pause()
                await client.update_weights(WeightSource(path="/ckpt/v3"), 3)
                await client.resume()
                fake.delay_s = 0.0
                later = await client.agenerate(
                    GenerationRequest([1], SamplingParams(max_new_tokens=2))
                )
                return await running, later
        finally:
            await runner.cleanup()

    first, later = run(main())
    assert fake.events == ["done", "update", "done"]  # the update waited for the request
    assert first.versions == [2, 2, 2] and later.versions == [3, 3]


def test_unexplained_aborts_are_retried_with_backoff_then_fail(monkeypatch) -> None:
    """Issue 32 #3: a server that aborts a request by itself (no pause, no weight update, no
    token) made generate_resuming resubmit forever; now it backs off and gives up, naming it."""
    monkeypatch.setattr(api, "UNEXPLAINED_ABORT_BACKOFF_S", 0.01)
    fake = FakeVLLM()
    fake.abort_always = True

    async def main():
        runner, address = await _serve(fake)
        try:
            async with VLLMClient([address], model_name="tiny") as client:
                request = GenerationRequest([1], SamplingParams(max_new_tokens=3), rid="dropped")
                return await generate_resuming(client, request)
        finally:
            await runner.cleanup()

    with pytest.raises(RuntimeError, match="request dropped: aborted 5 times in a row"):
        run(main())
    assert len(fake.bodies) == api.MAX_UNEXPLAINED_ABORTS


def test_seed_is_sent_only_when_set_and_survives_resume() -> None:
    fake = FakeVLLM()
    seeded = SamplingParams(max_new_tokens=5, temperature=1.0, seed=2**40 + 3)

    async def main():
        runner, address = await _serve(fake)
        try:
            async with VLLMClient([address], model_name="tiny") as client:
                await client.agenerate(GenerationRequest([1], SamplingParams(max_new_tokens=2)))
                fake.abort_next = True
                return await generate_resuming(client, GenerationRequest([1], seeded))
        finally:
            await runner.cleanup()

    resp = run(main())
    assert resp.n_resumes == 1 and len(resp.output_ids) == 5
    assert "seed" not in fake.bodies[0]
    assert [b["seed"] for b in fake.bodies[1:]] == [2**40 + 3] * 2


def test_clients_satisfy_the_protocol() -> None:
    assert isinstance(VLLMClient(["h:1"], model_name="m"), InferenceEngine)
    assert isinstance(SGLangClient(["h:1"]), InferenceEngine)


def test_parse_errors() -> None:
    with pytest.raises(ValueError, match="token_id"):
        parse_token("hello")
    with pytest.raises(ValueError, match="logprobs"):
        parse_completion({"choices": [{"finish_reason": "stop", "logprobs": None}]}, 0)
