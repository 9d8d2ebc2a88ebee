"""Our SGLang-API server over real HTTP, through the SGLang client (and raw requests)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch

from core.inference.api import GenerationRequest, SamplingParams, WeightSource, generate_resuming
from core.inference.clients.sglang_client import SGLangClient, sglang_sampling
from core.inference.engine.hf_engine import HFEngine
from core.inference.server.app import start_server
from core.models import load_model
from core.training.distributed import free_port
from tests.core.inference.helpers import hf_greedy, run, teacher_logprobs, wait_for_tokens

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(max_new_tokens=20, temperature=0.0)


def test_greedy_over_http_matches_engine_and_hf(
    servers, model_dir, engine, ref_model, tokenizer, prompts
) -> None:
    handle = servers.start(model_dir=model_dir)
    chosen = prompts[:4]

    async def main():
        async with SGLangClient([handle.address]) as client:
            remote = await asyncio.gather(
                *(client.agenerate(GenerationRequest(p, GREEDY)) for p in chosen)
            )
        local = [await engine.agenerate(GenerationRequest(p, GREEDY)) for p in chosen]
        return remote, local

    remote, local = run(main())
    expected = [hf_greedy(ref_model, tokenizer, p, 20) for p in chosen]
    assert [r.output_ids for r in remote] == [r.output_ids for r in local] == expected
    for r, loc in zip(remote, local, strict=True):
        torch.testing.assert_close(
            torch.tensor(r.logprobs), torch.tensor(loc.logprobs), atol=1e-4, rtol=0
        )
        assert r.versions == [0] * len(r.output_ids) and r.stop_reason == "length"


def test_sglang_response_shapes(servers, model_dir, prompts) -> None:
    handle = servers.start(model_dir=model_dir, seed=0)
    prompt = prompts[0]

    async def main():
        async with aiohttp.ClientSession() as s:
            body = {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 6, "temperature": 0, "top_k": -1},
                "return_logprob": True,
                "rid": "abc",
            }
            async with s.post(handle.url + "/generate", json=body) as r:
                single = await r.json()
            body["input_ids"] = [prompt, prompt[:5]]
            body["rid"] = None
            async with s.post(handle.url + "/generate", json=body) as r:
                batch = await r.json()
            async with s.post(handle.url + "/generate", json={"text": "hi"}) as r:
                assert r.status == 400
            async with s.get(handle.url + "/health") as r:
                assert r.status == 200
            async with s.get(handle.url + "/get_model_info") as r:
                info = await r.json()
        return single, batch, info

    single, batch, info = run(main())
    meta = single["meta_info"]
    assert meta["id"] == "abc" and meta["prompt_tokens"] == len(prompt)
    assert meta["completion_tokens"] == len(single["output_ids"]) == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["weight_version"] == "0" and meta["output_token_versions"] == [0] * 6
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == single["output_ids"] and all(t[2] is None for t in triples)
    assert all(isinstance(t[0], float) and t[0] <= 0 for t in triples)
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[0]["output_ids"] == single["output_ids"]
    assert info == {
        "model_path": str(model_dir),
        "tokenizer_path": str(model_dir),
        "is_generation": True,
        "weight_version": "0",
    }


def test_stop_token_over_http(servers, model_dir, prompts) -> None:
    handle = servers.start(model_dir=model_dir)

    async def main():
        async with SGLangClient([handle.address]) as client:
            free = await client.agenerate(GenerationRequest(prompts[1], GREEDY))
            stop = free.output_ids[3]
            sampling = SamplingParams(max_new_tokens=20, temperature=0.0, stop_token_ids=[stop])
            stopped = await client.agenerate(GenerationRequest(prompts[1], sampling))
            return free, stop, stopped

    free, stop, stopped = run(main())
    cut = free.output_ids.index(stop) + 1
    assert stopped.stop_reason == "stop" and stopped.output_ids == free.output_ids[:cut]


def test_pause_update_from_disk_resume_over_http(
    servers, model_dir, new_model_dir, prompts, ref_model, new_model
) -> None:
    engine = HFEngine(load_model(model_dir), None, seed=0)  # no eos: runs the full budget
    handle = servers.start(engine=engine, model_dir=model_dir)
    prompt = prompts[0]
    request = GenerationRequest(prompt, SamplingParams(max_new_tokens=300, temperature=1.0))

    async def main():
        async with SGLangClient([handle.address]) as client:
            task = asyncio.ensure_future(generate_resuming(client, request))
            await wait_for_tokens(engine, 10)
            await client.pause()
            with pytest.raises(RuntimeError, match="paused"):
                await SGLangClient([handle.address]).update_weights(
                    WeightSource(path=str(new_model_dir)), 1
                )
            await client.update_weights(WeightSource(path=str(new_model_dir)), 1)
            assert await client.server_versions() == [1]
            await client.resume()
            return await task, client.version

    try:
        resp, version = run(main())
    finally:
        engine.close()
    assert version == 1 and resp.stop_reason == "length" and resp.n_resumes == 1
    assert len(resp.output_ids) == 300
    assert set(resp.versions) == {0, 1} and resp.versions == sorted(resp.versions)
    versions = torch.tensor(resp.versions)
    for v, model in ((0, ref_model), (1, new_model)):
        expected = teacher_logprobs(model, prompt, resp.output_ids, 1.0)
        mask = versions == v
        torch.testing.assert_close(
            torch.tensor(resp.logprobs)[mask], expected[mask], atol=1e-4, rtol=0
        )


def test_update_without_pause_drains_and_bumps_version(
    servers, model_dir, new_model_dir, prompts
) -> None:
    """SGLang semantics: without abort_all_requests, in-flight requests finish first."""
    handle = servers.start(model_dir=model_dir)
    sampling = SamplingParams(max_new_tokens=60, temperature=1.0)

    async def main():
        async with SGLangClient([handle.address]) as client, aiohttp.ClientSession() as s:
            task = asyncio.ensure_future(client.agenerate(GenerationRequest(prompts[2], sampling)))
            await wait_for_tokens(handle.engine, 5)
            body = {"model_path": str(new_model_dir), "abort_all_requests": False}
            async with s.post(handle.url + "/update_weights_from_disk", json=body) as r:
                result = await r.json()
            done_before_update = task.done()
            async with s.post(
                handle.url + "/update_weights_from_disk", json={"model_path": "/nonexistent"}
            ) as r:
                failed = (r.status, await r.json())
            return await task, result, done_before_update, failed

    resp, result, done_before_update, failed = run(main())
    assert result["success"] is True and handle.engine.version == 1
    assert done_before_update and resp.stop_reason != "abort" and set(resp.versions) == {0}
    assert failed[0] == 400 and failed[1]["success"] is False
    assert not handle.engine.paused


def test_round_robin_and_sticky_resumes(servers, model_dir, prompts) -> None:
    a = servers.start(model_dir=model_dir)
    b = servers.start(model_dir=model_dir)

    async def main():
        async with SGLangClient([a.address, b.address]) as client:
            await asyncio.gather(
                *(client.agenerate(GenerationRequest(p, GREEDY)) for p in prompts[:4])
            )
            # an aborted request's rid stays on its server; resubmissions follow it
            sticky = client.server_for("resumed-rid")
            assert [client.server_for("resumed-rid") for _ in range(3)] == [sticky] * 3
            await client.agenerate(GenerationRequest(prompts[0], GREEDY, rid="resumed-rid"))
            assert "resumed-rid" not in client._rid_server  # forgotten once finished

    run(main())
    assert a.engine.stats.requests_served + b.engine.stats.requests_served == 5
    assert a.engine.stats.requests_served >= 2 and b.engine.stats.requests_served >= 2


def test_a_group_goes_to_one_server_and_groups_spread(servers, model_dir, prompts) -> None:
    """The samples of one prompt land on one server (its prefix cache computes the prompt
    once); distinct prompts go round-robin."""
    a = servers.start(model_dir=model_dir)
    b = servers.start(model_dir=model_dir)
    first, second = next((p, q) for p in prompts for q in prompts if len(p) != len(q))

    async def main():
        async with SGLangClient([a.address, b.address]) as client:
            group = [GenerationRequest(p, GREEDY) for p in (first, second) for _ in range(4)]
            await asyncio.gather(*(client.agenerate(r) for r in group))

    run(main())
    for handle in (a, b):  # prefill counts land when a round ends, after its responses
        run(handle.engine.wait_idle())
    assert a.engine.stats.requests_served == 4 == b.engine.stats.requests_served
    # every prompt token a server saw (prefilled, or copied from a group member) is its prompt's
    seen = {
        handle.engine.stats.prefill_tokens + handle.engine.stats.shared_prefill_tokens
        for handle in (a, b)
    }
    assert seen == {4 * len(first), 4 * len(second)}


def test_a_conversation_goes_back_to_its_server(servers, model_dir, prompts) -> None:
    """Three calls of one conversation (each prompt the last one + its reply + new tokens) land
    on one server, whose prefix cache serves every later call; without a session such calls
    alternate between the two servers (each a new prompt): the second is prefilled whole."""
    a = servers.start(model_dir=model_dir)
    b = servers.start(model_dir=model_dir)

    async def converse(first: int, session: str) -> None:
        async with SGLangClient([a.address, b.address]) as client:
            ids = list(prompts[first])
            for turn in range(3):
                reply = await client.agenerate(GenerationRequest(ids, GREEDY, session=session))
                ids += reply.output_ids + prompts[first + turn + 1][:5]  # + a tool's answer

    def served() -> list[tuple[int, int]]:
        for handle in (a, b):  # prefill counts land when a round ends, after its responses
            run(handle.engine.wait_idle())
        return [(h.engine.stats.requests_served, h.engine.stats.prefix_cached_tokens)
                for h in (a, b)]  # fmt: skip

    run(converse(0, "episode-1"))
    (n_a, cached_a), (n_b, cached_b) = served()
    assert sorted([n_a, n_b]) == [0, 3]
    with_session = cached_a + cached_b
    assert with_session >= 2 * len(prompts[0])  # calls 2 and 3 continued call 1
    run(converse(4, ""))  # other prompts: nothing of the first conversation in them
    (m_a, more_a), (m_b, more_b) = served()
    assert (m_a - n_a, m_b - n_b) in {(1, 2), (2, 1)}
    # only call 3 found a conversation (call 1's, on the same server); call 2 found none
    assert more_a + more_b - with_session <= len(prompts[4]) + GREEDY.max_new_tokens


def test_sessions_stick_and_move_off_a_server_that_went_down() -> None:
    client = SGLangClient(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    home = client.server_for("r1", [5, 6, 7], session="s")
    assert client.server_for("r2", [5, 6, 7, 8, 9], session="s") == home
    assert client.server_for("r3", [5, 6, 7, 1]) != home  # a new prompt, no session: the next
    client.mark_down(home, ConnectionError("test"))
    moved = client.server_for("r4", [5, 6, 7, 8, 9, 1], session="s")
    assert moved != home and client.server_for("r5", [1], session="s") == moved


def test_prompt_routes_skip_a_server_that_went_down() -> None:
    client = SGLangClient(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    home = client.server_for("r1", [5, 6, 7])
    assert client.server_for("r2", [5, 6, 7]) == home  # the same prompt, the same server
    assert client.server_for("r3", [5, 6]) != home  # a new prompt: the next server
    client.mark_down(home, ConnectionError("test"))
    moved = client.server_for("r4", [5, 6, 7])
    assert moved != home and client.server_for("r5", [5, 6, 7]) == moved


def test_client_retries_until_the_server_is_up(model_dir, engine, prompts) -> None:
    port = free_port()

    async def main():
        async with SGLangClient([f"127.0.0.1:{port}"], max_retries=6, retry_backoff_s=0.1) as c:
            task = asyncio.ensure_future(c.agenerate(GenerationRequest(prompts[0], GREEDY)))
            await asyncio.sleep(0.3)  # the first attempts hit a closed port
            handle = await start_server(engine=engine, port=port)
            try:
                return await task
            finally:
                await handle.stop()

    assert len(run(main()).output_ids) == 20

    async def dead():
        async with SGLangClient([f"127.0.0.1:{port}"], max_retries=1, retry_backoff_s=0.01) as c:
            await c.agenerate(GenerationRequest(prompts[0], GREEDY))

    with pytest.raises(aiohttp.ClientConnectionError):
        run(dead())


def test_sampling_seed_over_http_matches_in_process(servers, model_dir, engine, prompts) -> None:
    """SGLang's ``sampling_seed``: the client sends it, the server honours it, and a seeded
    request gives the in-process engine's tokens (even though the two engines' seeds differ)."""
    handle = servers.start(model_dir=model_dir, seed=31)
    seeded = SamplingParams(max_new_tokens=30, temperature=0.9, top_k=40, seed=77)
    assert sglang_sampling(seeded)["sampling_seed"] == 77
    assert "sampling_seed" not in sglang_sampling(SamplingParams())

    async def main():
        async with SGLangClient([handle.address]) as client:
            remote = await asyncio.gather(
                *(client.agenerate(GenerationRequest(p, seeded)) for p in prompts[:3])
            )
        local = [await engine.agenerate(GenerationRequest(p, seeded)) for p in prompts[:3]]
        async with aiohttp.ClientSession() as s:
            statuses = []
            for bad in ("77", 7.5, True):
                body = {
                    "input_ids": prompts[0],
                    "sampling_params": {"max_new_tokens": 4, "sampling_seed": bad},
                    "return_logprob": True,
                }
                async with s.post(handle.url + "/generate", json=body) as r:
                    statuses.append((r.status, (await r.json())["error"]["message"]))
        return remote, local, statuses

    remote, local, statuses = run(main())
    for r, loc in zip(remote, local, strict=True):
        assert r.output_ids == loc.output_ids
        torch.testing.assert_close(
            torch.tensor(r.logprobs), torch.tensor(loc.logprobs), atol=1e-4, rtol=0
        )
    assert remote[0].output_ids != remote[1].output_ids
    for status, message in statuses:
        assert status == 400 and "sampling_seed" in message


def test_the_sglang_client_sends_sglangs_sampling_fields_when_set() -> None:
    plain = sglang_sampling(SamplingParams())
    assert not {"min_p", "frequency_penalty", "ignore_eos", "logit_bias"} & set(plain)
    set_ = sglang_sampling(
        SamplingParams(
            min_p=0.1,
            frequency_penalty=0.5,
            presence_penalty=0.2,
            repetition_penalty=1.1,
            min_new_tokens=3,
            ignore_eos=True,
            logit_bias={7: -1.5},
        )  # fmt: skip
    )
    assert set_["min_p"] == 0.1 and set_["frequency_penalty"] == 0.5
    assert set_["presence_penalty"] == 0.2 and set_["repetition_penalty"] == 1.1
    assert set_["min_new_tokens"] == 3 and set_["ignore_eos"] is True
    assert set_["logit_bias"] == {"7": -1.5}
