"""The engine's prefix cache: a request that continues a finished one prefills only its new tokens,
and samples exactly what it would have sampled from a full prefill."""

from __future__ import annotations

import asyncio

import pytest
import torch

from core.inference.api import GenerationRequest, SamplingParams, WeightSource
from core.inference.engine.hf_engine import HFEngine
from core.inference.engine.prefix_cache import PrefixCache
from core.models import load_model
from core.training.shared_prompts import cache_kwarg
from tests.core.inference.helpers import run, teacher_logprobs, wait_for_tokens


def layers(n: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), fill), torch.full((2, n, 4), fill))]


def test_longest_proper_prefix_is_taken_and_budget_evicts_oldest() -> None:
    cache = PrefixCache(max_tokens=10)
    cache.store([1, 2], layers(2, 1.0))
    cache.store([1, 2, 3, 4], layers(4, 2.0))
    hit = cache.take([1, 2, 3, 4, 5])
    assert hit is not None and hit.tokens == (1, 2, 3, 4) and float(hit.layers[0][0][0, 0, 0]) == 2
    assert cache.take([1, 2, 3, 4, 5]).tokens == (1, 2)  # the longer one was taken out
    assert len(cache) == 0 and cache.tokens == 0
    cache.store([3, 3], layers(2))
    assert cache.take([3, 3]) is None  # equal, not a proper prefix: nothing left to compute
    assert cache.take([3, 4, 5]) is None
    cache.clear()

    cache.store([7] * 6, layers(6))
    cache.store([8] * 3, layers(3))
    cache.store([9] * 3, layers(3))  # 12 > 10 tokens: the oldest entry goes
    assert cache.tokens == 6 and cache.take([7] * 7) is None and cache.take([8] * 4) is not None
    cache.store([5] * 11, layers(11))  # larger than the whole budget: not kept
    assert cache.take([5] * 12) is None


def conversation(engine: HFEngine, prompts, n_turns: int, temperature: float):
    """Episodes of ``n_turns`` calls, run concurrently; each call's prompt is the last prompt,
    its output and a few new "tool" tokens (of different lengths per episode)."""

    async def episode(i: int) -> list[tuple[list[int], list[int], list[float]]]:
        prompt = list(prompts[i])
        calls = []
        for turn in range(n_turns):
            sampling = SamplingParams(max_new_tokens=6 + 3 * i, temperature=temperature, seed=i)
            resp = await engine.agenerate(GenerationRequest(prompt, sampling))
            calls.append((prompt, resp.output_ids, resp.logprobs))
            prompt = prompt + resp.output_ids + prompts[10 + i][: 3 + 4 * ((i + turn) % 3)]
        return calls

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(4)))

    return run(main())


def test_continuations_prefill_only_new_tokens_and_sample_the_same(
    model_dir, ref_model, prompts
) -> None:
    """Four concurrent 3-call conversations (rows with different cached and new lengths joining
    a live batch): the same tokens as an engine without the cache, log-probs equal to a
    teacher-forced pass, and the cached prefixes counted instead of prefilled."""
    results = {}
    for size in (0, 4096):
        with HFEngine(load_model(model_dir), None, chunk_tokens=2, prefix_cache_tokens=size) as e:
            results[size] = conversation(e, prompts, n_turns=3, temperature=1.0)
            stats = e.stats
        if size:
            cached = stats.prefix_cached_tokens
            # every later call continues its own last call: prompt + output minus the last token
            expected = sum(len(p) + len(o) - 1 for ep in results[size] for p, o, _ in ep[:-1])
            assert cached == expected
        else:
            assert stats.prefix_cached_tokens == 0
            full_prefill = stats.prefill_tokens
    assert stats.prefill_tokens + cached == full_prefill  # nothing computed twice, nothing lost
    for with_cache, without in zip(results[4096], results[0], strict=True):
        for (prompt, out, logprobs), (_, out0, logprobs0) in zip(with_cache, without, strict=True):
            assert out == out0
            torch.testing.assert_close(
                torch.tensor(logprobs), torch.tensor(logprobs0), atol=1e-5, rtol=0
            )
            expected = teacher_logprobs(ref_model, prompt, out, 1.0)
            torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)


def test_new_weights_clear_the_cache(model_dir, new_state, prompts) -> None:
    """After a weight update nothing computed with the old weights is reused."""
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)

    async def main(engine: HFEngine) -> int:
        first = await engine.agenerate(GenerationRequest(prompts[0], greedy))
        follow = prompts[0] + first.output_ids + prompts[1][:4]
        await engine.pause()
        await engine.update_weights(WeightSource(state_dict=new_state), 1)
        await engine.resume()
        second = await engine.agenerate(GenerationRequest(follow, greedy))  # must not hit
        # the version-1 request's own cache serves the next call
        await engine.agenerate(GenerationRequest(follow + second.output_ids + [5], greedy))
        return len(follow) + len(second.output_ids) - 1

    with HFEngine(load_model(model_dir), None, prefix_cache_tokens=4096) as engine:
        only_the_last_call = run(main(engine))
    assert engine.stats.prefix_cached_tokens == only_the_last_call


def test_kept_caches_outlive_new_weights(
    model_dir, ref_model, new_model, new_state, prompts
) -> None:
    """With ``keep_kv_on_update`` (PipelineRL's in-flight update) a conversation goes on from the
    keys and values the old weights computed: its next call prefills only the new tokens, under
    the new weights, and the log-probs it records are those of that mixed computation (which
    differ from a full prefill with the new weights)."""
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)

    async def main(engine: HFEngine):
        first = await engine.agenerate(GenerationRequest(prompts[0], sampling))
        follow = prompts[0] + first.output_ids + prompts[1][:4]
        await engine.pause()
        await engine.update_weights(WeightSource(state_dict=new_state), 1)
        await engine.resume()
        return first, follow, await engine.agenerate(GenerationRequest(follow, sampling))

    engine = HFEngine(load_model(model_dir), None, prefix_cache_tokens=4096, keep_kv_on_update=True)
    with engine:
        first, follow, second = run(main(engine))
    read = prompts[0] + first.output_ids[:-1]  # what the first call left in the cache
    assert engine.stats.prefix_cached_tokens == len(read)
    assert second.versions == [1] * len(second.output_ids)
    name = cache_kwarg(ref_model)  # "cache", or "past_key_values" before transformers 5.2x
    with torch.no_grad():
        past = getattr(ref_model(torch.tensor([read]), use_cache=True), name)
        rest = follow[len(read) :] + second.output_ids
        logits = new_model(torch.tensor([rest]), use_cache=True, **{name: past}).logits[0]
    new_rows = logits[len(rest) - len(second.output_ids) - 1 : -1].float()
    picked = torch.tensor(second.output_ids)[:, None]
    mixed = torch.log_softmax(new_rows, -1).gather(1, picked).squeeze(1)
    torch.testing.assert_close(torch.tensor(second.logprobs), mixed, atol=1e-4, rtol=0)
    recomputed = teacher_logprobs(new_model, follow, second.output_ids, 1.0)
    assert (torch.tensor(second.logprobs) - recomputed).abs().max() > 1e-3


@pytest.mark.parametrize("keep", [True, False])
def test_held_requests_go_on_across_a_weight_update(
    model_dir, new_model, new_state, prompts, keep: bool
) -> None:
    """``pause("hold")``: a running request is not aborted. After the new weights load it goes
    on decoding: on its KV cache with ``keep_kv_on_update`` (nothing prefilled again; later
    tokens read the old weights' keys and values), else re-prefilled, which gives exactly the
    new weights' log-probs."""
    sampling = SamplingParams(max_new_tokens=40, temperature=1.0, seed=5)

    async def main(engine: HFEngine):
        task = asyncio.ensure_future(engine.agenerate(GenerationRequest(prompts[0], sampling)))
        await wait_for_tokens(engine, 5)
        await engine.pause("hold")
        assert not task.done()  # held, not aborted
        await engine.update_weights(WeightSource(state_dict=new_state), 1)
        await engine.resume()
        return await task

    engine = HFEngine(load_model(model_dir), None, prefix_cache_tokens=4096, keep_kv_on_update=keep)
    with engine:
        resp = run(main(engine))
    assert resp.stop_reason == "length" and len(resp.output_ids) == 40
    assert resp.n_resumes == 1
    n_old = resp.versions.count(0)
    assert 0 < n_old < 40 and resp.versions == [0] * n_old + [1] * (40 - n_old)
    recomputed = teacher_logprobs(
        new_model, prompts[0] + resp.output_ids[:n_old], resp.output_ids[n_old:], 1.0
    )
    after = torch.tensor(resp.logprobs[n_old:])
    if keep:
        assert engine.stats.reprefilled_tokens == 0
        assert engine.stats.prefill_tokens == len(prompts[0])  # the prompt, once
        assert (after - recomputed).abs().max() > 1e-3  # the old weights' keys and values
    else:
        assert engine.stats.reprefilled_tokens == len(prompts[0]) + n_old
        torch.testing.assert_close(after, recomputed, atol=1e-4, rtol=0)


def test_a_continuation_and_a_new_request_join_a_running_batch_together(
    model_dir, ref_model, prompts
) -> None:
    """One round admits a cache hit and a miss beside a request already decoding: the three
    sample what a teacher-forced pass gives, and only the hit's prefix is skipped."""
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    long = SamplingParams(max_new_tokens=40, temperature=0.0)

    async def main(engine: HFEngine):
        first = await engine.agenerate(GenerationRequest(prompts[0], greedy))
        follow = prompts[0] + first.output_ids + prompts[1][:5]
        running = asyncio.ensure_future(engine.agenerate(GenerationRequest(prompts[2], long)))
        await wait_for_tokens(engine, 3)
        hit, miss = await asyncio.gather(
            engine.agenerate(GenerationRequest(follow, greedy)),
            engine.agenerate(GenerationRequest(prompts[3], greedy)),
        )
        return first, follow, [(follow, hit), (prompts[3], miss), (prompts[2], await running)]

    with HFEngine(load_model(model_dir), None, chunk_tokens=2, prefix_cache_tokens=4096) as e:
        first, follow, results = run(main(e))
    assert e.stats.prefix_cached_tokens == len(prompts[0]) + len(first.output_ids) - 1
    for prompt, resp in results:
        ids = torch.tensor([prompt + resp.output_ids])
        with torch.no_grad():
            logits = ref_model(ids).logits[0, len(prompt) - 1 : -1]
        assert resp.output_ids == logits.argmax(-1).tolist()
        expected = teacher_logprobs(ref_model, prompt, resp.output_ids, 0.0)
        torch.testing.assert_close(torch.tensor(resp.logprobs), expected, atol=1e-4, rtol=0)


def test_servers_the_run_launches_get_its_cache_size(model_dir, tmp_path) -> None:
    """``inference.prefix_cache_tokens`` and ``kv_after_update`` reach our server's command line,
    which accepts them."""
    from core.config import load_config
    from core.inference.server.app import parse_args
    from core.runtime.fleet import server_spec

    config = load_config(
        None, ["inference.prefix_cache_tokens=777", "inference.server_launcher=asyncrl",
               "inference.kv_after_update=keep"]
    )  # fmt: skip
    extra = server_spec(config, str(model_dir), 0, [str(tmp_path)], port=1234).extra_args
    assert extra[extra.index("--prefix-cache-tokens") + 1] == "777"
    args = parse_args(["--model", str(model_dir), *extra])
    assert args.prefix_cache_tokens == 777 and args.kv_after_update == "keep"


def test_the_in_process_engine_gets_the_cache_and_batch_settings(model_dir) -> None:
    from core.config import load_config
    from core.runtime.rollout_worker import build_engine

    for policy, keep in (("recompute", False), ("keep", True)):
        config = load_config(
            None, [f"inference.kv_after_update={policy}", "inference.prefix_cache_tokens=999"]
        )
        with build_engine(config, str(model_dir)) as engine:
            assert engine.keep_kv_on_update is keep
            assert engine._decoder.prefixes.max_tokens == 999
    # the batch: inference.max_batch_rows rows, or as many as episodes in flight (0)
    for rows, expected in ((0, 64), (16, 16)):
        config = load_config(
            None, [f"inference.max_batch_rows={rows}", "rollout.max_concurrent=64"]
        )
        with build_engine(config, str(model_dir)) as engine:
            assert engine.max_batch_size == expected
