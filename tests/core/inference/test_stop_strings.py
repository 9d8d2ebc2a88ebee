"""Stop strings: the engine ends after the token that completes one (the string's tokens kept),
the server takes them only with a tokenizer, and a workflow cuts a completion at the first one
whichever engine produced it."""

from __future__ import annotations

import functools

import pytest

from core.data.prompting import Prompter
from core.inference.api import GenerationRequest, GenerationResponse, SamplingParams
from core.inference.server.sglang_params import parse_sampling
from core.inference.server.validation import RequestError, RequestLimits
from core.inference.stop_strings import cut_at_stop, cut_response, tail_matches
from tests.core.inference.helpers import run

pytestmark = pytest.mark.unit


def seeded(prompt: list[int], n: int = 24, **kw) -> GenerationRequest:
    """Seeded sampling: the same tokens at each position with or without a stop string (a
    random-init model's greedy output is one token repeated)."""
    return GenerationRequest(
        prompt, SamplingParams(max_new_tokens=n, temperature=1.0, seed=7, **kw)
    )


def test_engine_stops_after_the_token_that_completes_a_stop_string(
    engine, tokenizer, prompts
) -> None:
    free = run(engine.agenerate(seeded(prompts[3], 24)))
    decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
    at, stop = next(
        (at, text[-2:])
        for at in range(4, 20)
        if (text := decode(free.output_ids[:at]))[-2:].strip() and text[-2:] not in text[:-1]
    )
    stopped = run(engine.agenerate(seeded(prompts[3], 24, stop=[stop])))
    n = cut_at_stop(decode, free.output_ids, [stop])
    assert n is not None and n <= at
    assert stopped.stop_reason == "stop" and stopped.output_ids == free.output_ids[:n]
    assert stop in decode(stopped.output_ids) and stop not in decode(stopped.output_ids[:-1])
    assert stopped.logprobs == pytest.approx(free.logprobs[:n])


def test_engine_without_tokenizer_refuses_stop_strings(no_eos_engine, prompts) -> None:
    with pytest.raises(ValueError, match="stop strings need the engine's tokenizer"):
        run(no_eos_engine.agenerate(seeded(prompts[0], 4, stop=["x"])))


@pytest.mark.parametrize("bad", [[""], ["x" * 257], ["a"] * 17])
def test_bad_stop_strings_are_refused(engine, prompts, bad) -> None:
    with pytest.raises(ValueError, match="stop"):
        run(engine.agenerate(seeded(prompts[0], 4, stop=bad)))


def test_cut_and_tail_agree_with_a_linear_scan(tokenizer) -> None:
    ids = tokenizer("Answer: 12 apples. #### 12\nQuestion: next")["input_ids"]
    decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
    for stops in (["\nQuestion"], ["####"], ["apples", "####"], ["absent"]):
        linear = next(
            (k for k in range(1, len(ids) + 1) if any(s in decode(ids[:k]) for s in stops)), None
        )
        assert cut_at_stop(decode, ids, stops) == linear
        if linear is not None:  # called after each token, the tail test fires first at `linear`
            fired = [k for k in range(1, len(ids) + 1) if tail_matches(decode, ids[:k], stops)]
            assert fired[0] == linear


def test_cut_response_trims_tokens_logprobs_and_versions(tokenizer) -> None:
    ids = tokenizer("x = 1\n```\nmore text after")["input_ids"]
    response = GenerationResponse(ids, [-0.5] * len(ids), list(range(len(ids))), "length")
    cut = cut_response(tokenizer, response, ["```"])
    n = len(cut.output_ids)
    assert cut.stop_reason == "stop" and 0 < n < len(ids)
    assert cut.logprobs == response.logprobs[:n] and cut.versions == list(range(n))
    assert tokenizer.decode(cut.output_ids).endswith("```")
    assert cut_response(tokenizer, response, ["absent"]) is response


def test_server_accepts_stop_strings_only_with_a_tokenizer() -> None:
    raw = {"max_new_tokens": 4, "stop": "\n\n", "no_stop_trim": True}
    with pytest.raises(RequestError) as err:
        parse_sampling(raw, 3, RequestLimits(vocab_size=100), "sampling_params")
    assert err.value.field == "sampling_params.stop"
    params = parse_sampling(raw, 3, RequestLimits(vocab_size=100, stop_strings=True), "s")
    assert params.stop == ["\n\n"]
    with pytest.raises(RequestError, match="no_stop_trim"):
        parse_sampling(
            {**raw, "no_stop_trim": "yes"}, 3, RequestLimits(100, stop_strings=True), "s"
        )
    with pytest.raises(RequestError, match="stop"):
        parse_sampling({"stop": [1]}, 3, RequestLimits(100, stop_strings=True), "s")


def test_prompter_names_a_bad_stop_string(tokenizer) -> None:
    with pytest.raises(ValueError, match=r"data.stop_strings\[1\]"):
        Prompter(tokenizer, stop_strings=["ok", ""])
    assert Prompter(tokenizer, stop_strings=["\n\n"]).stop_strings == ["\n\n"]
