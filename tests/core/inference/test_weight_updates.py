"""Pause, weight update and resume on the in-process engine, and the weight loader itself."""

from __future__ import annotations

import asyncio

import pytest
import torch

from core.inference.api import GenerationRequest, SamplingParams, WeightSource, generate_resuming
from core.inference.engine.hf_engine import HFEngine
from core.inference.engine.weights import load_weights, read_state_dict
from core.models import load_model
from tests.core.inference.helpers import run, teacher_logprobs, wait_for_tokens

pytestmark = pytest.mark.unit

LONG = SamplingParams(max_new_tokens=300, temperature=1.0)


def assert_logprobs_follow_versions(resp, prompt, old_model, new_model, temperature=1.0) -> None:
    """v0 tokens match the old weights' teacher-forced logprobs, v1 tokens the new ones'."""
    versions = torch.tensor(resp.versions)
    got = torch.tensor(resp.logprobs)
    for version, model in ((0, old_model), (1, new_model)):
        expected = teacher_logprobs(model, prompt, resp.output_ids, temperature)
        mask = versions == version
        torch.testing.assert_close(got[mask], expected[mask], atol=1e-4, rtol=0)


def test_pause_aborts_then_resume_continues_on_new_weights(
    no_eos_engine: HFEngine, prompts, ref_model, new_model, new_state
) -> None:
    engine, prompt = no_eos_engine, prompts[0]

    async def main():
        first = asyncio.ensure_future(engine.agenerate(GenerationRequest(prompt, LONG, "r1")))
        await wait_for_tokens(engine, 10)
        await engine.pause()
        partial = await first  # settled by the time pause() returns
        resumed = asyncio.ensure_future(
            generate_resuming(engine, GenerationRequest(prompt, LONG, "r2"))
        )
        await asyncio.sleep(0.05)
        assert not resumed.done()  # queued while paused, not aborted
        await engine.resume()
        await wait_for_tokens(engine, 10)
        await engine.pause()
        await engine.update_weights(WeightSource(state_dict=new_state), 1)
        await engine.resume()
        return partial, await resumed

    partial, resp = run(main())
    assert partial.stop_reason == "abort" and 0 < len(partial.output_ids) < LONG.max_new_tokens
    assert set(partial.versions) == {0}
    assert resp.stop_reason == "length" and len(resp.output_ids) == LONG.max_new_tokens
    assert resp.n_resumes == 1 and engine.version == 1
    assert set(resp.versions) == {0, 1} and resp.versions == sorted(resp.versions)
    assert_logprobs_follow_versions(resp, prompt, ref_model, new_model)


def test_update_weights_requires_pause(engine: HFEngine, new_state) -> None:
    with pytest.raises(RuntimeError, match="paused"):
        run(engine.update_weights(WeightSource(state_dict=new_state), 1))
    assert engine.version == 0


def test_requests_wait_while_paused_and_complete_after_resume(engine: HFEngine, prompts) -> None:
    sampling = SamplingParams(max_new_tokens=8, temperature=0.0)

    async def main():
        await engine.pause()
        waiter = asyncio.ensure_future(engine.wait_until_resumed())
        tasks = [
            asyncio.ensure_future(engine.agenerate(GenerationRequest(p, sampling)))
            for p in prompts[:4]
        ]
        await asyncio.sleep(0.1)
        assert not any(t.done() for t in tasks) and not waiter.done()
        assert engine.num_waiting == 4
        await engine.resume()
        await waiter
        return await asyncio.gather(*tasks)

    assert all(r.stop_reason != "abort" and r.output_ids for r in run(main()))


def test_retract_mode_keeps_requests_across_the_update(
    no_eos_engine: HFEngine, prompts, ref_model, new_model, new_state
) -> None:
    """SGLang's retract/in_place: in-flight requests resume after the update in one response."""
    engine, prompt = no_eos_engine, prompts[1]

    async def main():
        task = asyncio.ensure_future(engine.agenerate(GenerationRequest(prompt, LONG)))
        await wait_for_tokens(engine, 10)
        await engine.pause("retract")
        assert not task.done()
        await engine.update_weights(WeightSource(state_dict=new_state), 1)
        await engine.resume()
        return await task

    resp = run(main())
    assert resp.stop_reason == "length" and resp.n_resumes == 1
    assert set(resp.versions) == {0, 1} and resp.versions == sorted(resp.versions)
    assert_logprobs_follow_versions(resp, prompt, ref_model, new_model)


def test_drain_mode_finishes_in_flight_requests_first(no_eos_engine: HFEngine, prompts) -> None:
    engine = no_eos_engine
    sampling = SamplingParams(max_new_tokens=40, temperature=1.0)

    async def main():
        task = asyncio.ensure_future(engine.agenerate(GenerationRequest(prompts[2], sampling)))
        await wait_for_tokens(engine, 5)
        await engine.pause("drain")
        assert task.done()  # drain returns once in-flight requests finished
        late = asyncio.ensure_future(engine.agenerate(GenerationRequest(prompts[3], sampling)))
        await asyncio.sleep(0.05)
        assert not late.done()
        await engine.resume()
        return await task, await late

    first, late = run(main())
    assert first.stop_reason == late.stop_reason == "length"


def test_update_from_sharded_folder_with_tied_embeddings(
    model_dir, new_model, tmp_path, prompts
) -> None:
    new_model.save_pretrained(str(tmp_path), max_shard_size="300KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) > 1 and "model.safetensors" not in shards
    assert "lm_head.weight" not in read_state_dict(WeightSource(path=str(tmp_path)))

    model = load_model(model_dir)
    load_weights(model, read_state_dict(WeightSource(path=f"file://{tmp_path}")))
    for (name, got), want in zip(
        model.state_dict().items(), new_model.state_dict().values(), strict=True
    ):
        assert torch.equal(got, want), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_bad_weights_are_rejected_and_model_untouched(engine: HFEngine, new_state) -> None:
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    broken = {k: v for k, v in new_state.items() if "layers.0.mlp" not in k}

    async def main():
        await engine.pause()
        with pytest.raises(ValueError, match="missing"):
            await engine.update_weights(WeightSource(state_dict=broken), 1)
        with pytest.raises(FileNotFoundError):
            await engine.update_weights(WeightSource(path="/nonexistent/weights"), 1)
        with pytest.raises(ValueError, match="local"):
            await engine.update_weights(WeightSource(path="s3://bucket/weights"), 1)
        await engine.resume()

    run(main())
    assert engine.version == 0
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, before[k]), k
