"""The in-process engine: greedy parity with HF, exact logprobs, sampling knobs, batching."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from core.inference.api import (
    GenerationRequest,
    InferenceEngine,
    SamplingParams,
    generate_resuming,
)
from core.inference.engine.hf_engine import HFEngine
from core.inference.engine.sampling import BatchSampling, sample_next
from core.models import load_model
from tests.core.inference.helpers import hf_greedy, run, teacher_logprobs, wait_for_tokens

pytestmark = pytest.mark.unit


def greedy(prompt: list[int], n: int = 24, **kw) -> GenerationRequest:
    return GenerationRequest(prompt, SamplingParams(max_new_tokens=n, temperature=0.0, **kw))


def test_engine_satisfies_protocol(engine: HFEngine) -> None:
    assert isinstance(engine, InferenceEngine)
    assert engine.version == 0 and not engine.paused


def test_greedy_matches_hf_generate_alone_and_batched(
    engine, ref_model, tokenizer, prompts
) -> None:
    chosen = prompts[:4]
    expected = [hf_greedy(ref_model, tokenizer, p, 24) for p in chosen]

    async def main():
        alone = [await engine.agenerate(greedy(p)) for p in chosen]
        batched = await asyncio.gather(*(engine.agenerate(greedy(p)) for p in chosen))
        return alone, batched

    alone, batched = run(main())
    assert [r.output_ids for r in alone] == expected
    # left padding and a shared batch do not change greedy choices
    assert [r.output_ids for r in batched] == expected
    assert all(r.versions == [0] * len(r.output_ids) for r in alone)


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.7, 0.9, 20)]
)
def test_logprobs_match_teacher_forcing(
    no_eos_engine, ref_model, prompts, temperature, top_p, top_k
) -> None:
    """Behaviour logprobs are log_softmax(logits / T) before top-p/top-k truncation."""
    sampling = SamplingParams(max_new_tokens=40, temperature=temperature, top_p=top_p, top_k=top_k)

    async def main():
        return await asyncio.gather(
            *(no_eos_engine.agenerate(GenerationRequest(p, sampling)) for p in prompts[:6])
        )

    for prompt, resp in zip(prompts[:6], run(main()), strict=True):
        assert len(resp.output_ids) == 40 and resp.stop_reason == "length"
        expected = teacher_logprobs(ref_model, prompt, resp.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(resp.logprobs), expected, atol=1e-4, rtol=0)


def test_greedy_logprobs_are_untempered(engine, ref_model, prompts) -> None:
    resp = run(engine.agenerate(greedy(prompts[0], 16)))
    expected = teacher_logprobs(ref_model, prompts[0], resp.output_ids, 1.0)
    torch.testing.assert_close(torch.tensor(resp.logprobs), expected, atol=1e-4, rtol=0)


def test_top_k_1_and_tiny_top_p_are_greedy(no_eos_engine, prompts) -> None:
    async def main():
        ref = await no_eos_engine.agenerate(greedy(prompts[1], 20))
        k1 = await no_eos_engine.agenerate(
            GenerationRequest(prompts[1], SamplingParams(max_new_tokens=20, top_k=1))
        )
        p0 = await no_eos_engine.agenerate(
            GenerationRequest(prompts[1], SamplingParams(max_new_tokens=20, top_p=1e-6))
        )
        return ref, k1, p0

    ref, k1, p0 = run(main())
    assert k1.output_ids == ref.output_ids == p0.output_ids


def test_top_k_restricts_the_support(no_eos_engine, ref_model, prompts) -> None:
    """Every sampled token is among the k most likely at its position."""
    sampling = SamplingParams(max_new_tokens=30, temperature=1.5, top_k=3)
    resp = run(no_eos_engine.agenerate(GenerationRequest(prompts[2], sampling)))
    ids = torch.tensor([prompts[2] + resp.output_ids])
    with torch.no_grad():
        logits = ref_model(ids).logits[0, len(prompts[2]) - 1 : -1]
    top3 = logits.topk(3, dim=-1).indices
    assert all(t in row for t, row in zip(resp.output_ids, top3.tolist(), strict=True))


def test_stop_tokens_and_max_new_tokens(engine, prompts) -> None:
    async def main():
        free = await engine.agenerate(greedy(prompts[3], 24))
        stop = next(t for i, t in enumerate(free.output_ids) if i >= 2)
        cut = free.output_ids.index(stop) + 1
        stopped = await engine.agenerate(greedy(prompts[3], 24, stop_token_ids=[stop]))
        short = await engine.agenerate(greedy(prompts[3], 5))
        return free, cut, stopped, short

    free, cut, stopped, short = run(main())
    assert stopped.stop_reason == "stop" and stopped.output_ids == free.output_ids[:cut]
    assert short.stop_reason == "length" and short.output_ids == free.output_ids[:5]
    assert free.stop_reason == "length" and len(free.output_ids) == 24


def test_eos_from_the_tokenizer_stops(model_dir, tokenizer, prompts) -> None:
    """The tokenizer's eos is a stop token by default (made the likeliest token by a hook)."""
    model = load_model(model_dir)
    eos = tokenizer.eos_token_id

    def favour_eos(module, inputs, logits):
        logits[..., eos] += 100.0
        return logits

    model.lm_head.register_forward_hook(favour_eos)
    with HFEngine(model, tokenizer) as eng:
        resp = run(eng.agenerate(greedy(prompts[0], 10)))
    assert resp.output_ids == [eos] and resp.stop_reason == "stop"


def test_same_seed_reproduces_other_seed_differs(model_dir, tokenizer, prompts) -> None:
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0)

    def sample(seed: int) -> list[list[int]]:
        with HFEngine(load_model(model_dir), tokenizer, seed=seed) as eng:
            return [
                run(eng.agenerate(GenerationRequest(p, sampling))).output_ids for p in prompts[:3]
            ]

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other


def settle(engine: HFEngine) -> None:
    """Wait until the worker has booked its last round in ``engine.stats``: it answers the
    requests first, so reading the stats right after the last response races with it."""
    run(engine.wait_idle())


def test_concurrent_requests_are_batched_and_faster(no_eos_engine, prompts) -> None:
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0)
    requests = [GenerationRequest(p, sampling) for p in prompts[:32]]

    async def sequential() -> float:
        start = time.perf_counter()
        for r in requests:
            await no_eos_engine.agenerate(r)
        return time.perf_counter() - start

    async def concurrent() -> float:
        start = time.perf_counter()
        out = await asyncio.gather(*(no_eos_engine.agenerate(r) for r in requests))
        assert all(len(o.output_ids) == 24 for o in out)
        return time.perf_counter() - start

    run(concurrent())  # warm-up: first calls of each batch shape are slower
    seq_s = run(sequential())
    settle(no_eos_engine)
    rounds_before = no_eos_engine.stats.batches
    rows_before = no_eos_engine.stats.rows
    conc_s = run(concurrent())
    settle(no_eos_engine)
    ratio = seq_s / conc_s
    rows_per_round = (no_eos_engine.stats.rows - rows_before) / (
        no_eos_engine.stats.batches - rounds_before
    )
    print(
        f"\n32 requests x 24 tokens: sequential {seq_s:.2f}s, concurrent {conc_s:.2f}s, "
        f"ratio {ratio:.1f}x, {rows_per_round:.1f} requests per round"
    )
    assert ratio > 2
    assert rows_per_round > 1
    assert no_eos_engine.stats.mean_tokens_per_step > 1


def test_cancelled_request_does_not_disturb_others(no_eos_engine, prompts) -> None:
    sampling = SamplingParams(max_new_tokens=60, temperature=1.0)

    async def main():
        doomed = asyncio.ensure_future(
            no_eos_engine.agenerate(GenerationRequest(prompts[0], sampling))
        )
        kept = asyncio.ensure_future(
            no_eos_engine.agenerate(GenerationRequest(prompts[1], sampling))
        )
        await asyncio.sleep(0.05)
        doomed.cancel()
        return await kept

    assert len(run(main()).output_ids) == 60
    assert no_eos_engine.num_running == 0


def test_invalid_requests(engine, prompts) -> None:
    with pytest.raises(ValueError, match="input_ids"):
        run(engine.agenerate(GenerationRequest([], SamplingParams())))
    with pytest.raises(ValueError, match="top_p"):
        run(engine.agenerate(GenerationRequest(prompts[0], SamplingParams(top_p=0.0))))
    with pytest.raises(ValueError, match="temperature"):
        run(engine.agenerate(GenerationRequest(prompts[0], SamplingParams(temperature=-1))))
    empty = run(engine.agenerate(GenerationRequest(prompts[0], SamplingParams(max_new_tokens=0))))
    assert empty.output_ids == [] and empty.stop_reason == "length"


def test_from_pretrained_and_close(model_dir, tokenizer, prompts) -> None:
    eng = HFEngine.from_pretrained(model_dir, max_batch_size=8, chunk_tokens=4, seed=1)
    assert tokenizer.eos_token_id in eng.eos_token_ids
    assert eng.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    resp = run(eng.agenerate(greedy(prompts[0], 8)))
    assert len(resp.output_ids) <= 8
    eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        run(eng.agenerate(greedy(prompts[0], 8)))


@pytest.mark.parametrize("splice", [True, False], ids=["splice-kv", "re-prefill"])
def test_rows_joining_and_leaving_stay_exact(model_dir, ref_model, prompts, splice) -> None:
    """Requests arrive while others decode and finish at different times; every token is still
    what a teacher-forced pass gives (greedy argmax / exact logprob), with or without splicing."""
    lengths = [40, 10, 25, 5, 30, 15]
    temperatures = [1.0, 0.0, 0.7, 1.0, 0.0, 1.0]
    engine = HFEngine(load_model(model_dir), None, max_batch_size=8, chunk_tokens=4, splice=splice)

    async def main():
        tasks = []
        for prompt, n, t in zip(prompts, lengths, temperatures, strict=False):
            sampling = SamplingParams(max_new_tokens=n, temperature=t)
            tasks.append(
                asyncio.ensure_future(engine.agenerate(GenerationRequest(prompt, sampling)))
            )
            await wait_for_tokens(engine, 3)  # the next one arrives mid-decode
        return await asyncio.gather(*tasks)

    with engine:
        responses = run(main())
    for prompt, n, t, resp in zip(prompts, lengths, temperatures, responses, strict=False):
        assert len(resp.output_ids) == n
        expected = teacher_logprobs(ref_model, prompt, resp.output_ids, t)
        torch.testing.assert_close(torch.tensor(resp.logprobs), expected, atol=1e-4, rtol=0)
        if t == 0:
            ids = torch.tensor([prompt + resp.output_ids])
            with torch.no_grad():
                logits = ref_model(ids).logits[0, len(prompt) - 1 : -1]
            assert resp.output_ids == logits.argmax(-1).tolist()
    assert engine.stats.batches > 1
    if splice:
        assert engine.stats.reprefilled_tokens == 0
    else:
        assert engine.stats.reprefilled_tokens > 0


SEEDED = [
    SamplingParams(max_new_tokens=100, temperature=1.0, seed=1234),
    SamplingParams(max_new_tokens=100, temperature=0.8, top_k=50, top_p=0.95, seed=2**40 + 7),
]


def crowd(prompts: list[list[int]]) -> list[GenerationRequest]:
    """18 other requests: unseeded, seeded, greedy, truncated, of different lengths."""
    kinds = [
        SamplingParams(max_new_tokens=30, temperature=1.0),
        SamplingParams(max_new_tokens=70, temperature=1.0, seed=5),
        SamplingParams(max_new_tokens=15, temperature=0.0),
        SamplingParams(max_new_tokens=50, temperature=0.7, top_p=0.9, seed=1234),
        SamplingParams(max_new_tokens=120, temperature=1.2, top_k=10),
        SamplingParams(max_new_tokens=40, temperature=1.0, seed=1235),
    ]
    return [GenerationRequest(prompts[(i + 3) % 32], kinds[i % 6]) for i in range(18)]


def seeded_alone(model_dir, prompts) -> list:
    """The reference: each seeded request by itself, on an engine with another generator seed."""
    with HFEngine(load_model(model_dir), None, seed=99) as eng:
        return [run(eng.agenerate(GenerationRequest(prompts[i], s))) for i, s in enumerate(SEEDED)]


def assert_same_samples(got, expected, n: int = 100) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g.output_ids == e.output_ids and len(g.output_ids) == n
        torch.testing.assert_close(
            torch.tensor(g.logprobs), torch.tensor(e.logprobs), atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("splice", [True, False], ids=["splice-kv", "re-prefill"])
def test_seeded_request_is_the_same_alone_and_in_a_crowd(model_dir, prompts, splice) -> None:
    """Seeded requests join 18 concurrent others mid-decode, in a batch capped at 8 (so rows
    queue, join and leave across many rounds): their tokens do not change."""
    alone = seeded_alone(model_dir, prompts)
    engine = HFEngine(load_model(model_dir), None, max_batch_size=8, chunk_tokens=4, splice=splice)

    async def main():
        others = [asyncio.ensure_future(engine.agenerate(r)) for r in crowd(prompts)]
        await wait_for_tokens(engine, 20)
        mine = [engine.agenerate(GenerationRequest(prompts[i], s)) for i, s in enumerate(SEEDED)]
        return await asyncio.gather(*mine), await asyncio.gather(*others)

    with engine:
        mine, others = run(main())
    assert_same_samples(mine, alone)
    assert engine.stats.batches > 4 and engine.stats.mean_tokens_per_step > 2
    assert all(
        len(o.output_ids) == r.sampling.max_new_tokens
        for o, r in zip(others, crowd(prompts), strict=True)
    )
    assert alone[0].output_ids != alone[1].output_ids


def test_seeded_request_survives_abort_and_retract_pauses(
    no_eos_engine, model_dir, prompts
) -> None:
    """Interrupted twice (abort -> resubmitted by generate_resuming; retract -> re-prefilled),
    on the same weights: the same tokens as an uninterrupted run."""
    alone = seeded_alone(model_dir, prompts)
    engine = no_eos_engine

    async def main():
        tasks = [
            asyncio.ensure_future(generate_resuming(engine, GenerationRequest(prompts[i], s)))
            for i, s in enumerate(SEEDED)
        ]
        for mode in ("abort", "retract"):
            await wait_for_tokens(engine, 30)
            await engine.pause(mode)
            await engine.resume()
        return await asyncio.gather(*tasks)

    got = run(main())
    assert_same_samples(got, alone)
    assert [r.n_resumes for r in got] == [2, 2]  # resubmitted after the abort, retracted once
    assert engine.stats.aborted == 2


def test_seeded_samples_reproduce_from_teacher_forced_logits(
    no_eos_engine, ref_model, prompts
) -> None:
    """A reference implementation (one forward pass + sample_next at the same positions) picks
    exactly the engine's tokens: the noise depends on nothing else."""
    params = SEEDED[1]
    prompt = prompts[4]
    resp = run(no_eos_engine.agenerate(GenerationRequest(prompt, params)))
    n = len(resp.output_ids)
    with torch.no_grad():
        logits = ref_model(torch.tensor([prompt + resp.output_ids])).logits[0, len(prompt) - 1 : -1]
    tokens, logprobs = sample_next(
        logits,
        BatchSampling.from_params([params] * n, logits.shape[-1], logits.device),
        torch.Generator(),
        torch.arange(n) + len(prompt),
    )
    assert tokens.tolist() == resp.output_ids
    torch.testing.assert_close(logprobs, torch.tensor(resp.logprobs), atol=1e-4, rtol=0)


def test_different_seeds_differ_and_unseeded_requests_vary(no_eos_engine, prompts) -> None:
    def request(seed: int | None) -> GenerationRequest:
        return GenerationRequest(prompts[0], SamplingParams(max_new_tokens=24, seed=seed))

    async def main():
        return await asyncio.gather(
            *(no_eos_engine.agenerate(request(s)) for s in (1, 2, 1, None, None))
        )

    one, two, one_again, free_a, free_b = run(main())
    assert one.output_ids == one_again.output_ids
    assert one.output_ids != two.output_ids
    assert free_a.output_ids != free_b.output_ids  # one generator, two different draws
    assert all(len(r.output_ids) == 24 for r in (one, two, free_a, free_b))


def test_a_group_shares_one_prefill_and_samples_as_if_alone(model_dir, ref_model, prompts) -> None:
    """Four samples of one prompt (GRPO's group) arrive together with two other requests: the
    group is prefilled once and each member copies its cache, yet every response is the one an
    engine without sharing gives (same seeded tokens, same log-probs, teacher-forced exact)."""
    group = [GenerationRequest(prompts[5], SamplingParams(max_new_tokens=40, seed=s))
             for s in range(4)]  # fmt: skip
    others = [GenerationRequest(prompts[6], SamplingParams(max_new_tokens=40, seed=9)),
              greedy(prompts[7], 40)]  # fmt: skip

    def generate(share: bool) -> tuple[list, HFEngine]:
        engine = HFEngine(load_model(model_dir), None, share_prefill=share)

        async def main():
            await engine.pause("abort")  # queue all six, then start them in one round
            tasks = [asyncio.ensure_future(engine.agenerate(r)) for r in group + others]
            while engine.num_waiting < len(tasks):
                await asyncio.sleep(0.01)
            await engine.resume()
            return await asyncio.gather(*tasks)

        with engine:
            return run(main()), engine

    shared, engine = generate(share=True)
    alone, reference = generate(share=False)
    assert engine.stats.shared_prefill_tokens == 3 * len(prompts[5])
    assert reference.stats.shared_prefill_tokens == 0
    assert reference.stats.prefill_tokens - engine.stats.prefill_tokens == 3 * len(prompts[5])
    assert_same_samples(shared, alone, n=40)
    assert len({tuple(r.output_ids) for r in shared[:4]}) == 4  # the members sample apart
    for request, resp in zip(group + others, shared, strict=True):
        expected = teacher_logprobs(ref_model, request.input_ids, resp.output_ids,
                                    request.sampling.temperature)  # fmt: skip
        torch.testing.assert_close(torch.tensor(resp.logprobs), expected, atol=1e-4, rtol=0)
