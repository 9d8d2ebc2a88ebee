"""SGLang's penalties, min_new_tokens, logit_bias and min_p against hand computations, and in
the engine across an interruption."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from core.inference.api import GenerationRequest, SamplingParams, generate_resuming
from core.inference.engine.penalties import (
    RoundPenalties,
    additive_penalties,
    repetition_penalty,
    stop_token_mask,
)
from core.inference.engine.sampling import truncate_logits, validate_sampling
from tests.core.inference.helpers import run, wait_for_tokens

LOGITS = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
COUNTS = torch.tensor([[0.0, 2.0, 1.0, 0.0]])  # token 1 generated twice, token 2 once


def test_frequency_and_presence_penalties_by_hand() -> None:
    out = additive_penalties(LOGITS, COUNTS, torch.tensor([0.5]), torch.tensor([0.25]))
    # token 1: 2 - 0.5*2 - 0.25; token 2: -1 - 0.5*1 - 0.25; tokens 0 and 3 untouched
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.75, -1.75, 0.5]]))


def test_repetition_penalty_by_hand() -> None:
    out = repetition_penalty(LOGITS, COUNTS, torch.tensor([2.0]))
    # generated tokens only: a positive logit halved, a negative one doubled
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0, -2.0, 0.5]]))


def test_stop_token_mask_only_on_active_rows() -> None:
    logits = torch.zeros((2, 3))
    held = torch.tensor([[False, True, False], [False, True, False]])
    out = stop_token_mask(logits, held, torch.tensor([True, False]))
    assert out[0].tolist() == [0.0, -math.inf, 0.0] and out[1].tolist() == [0.0, 0.0, 0.0]


def test_round_penalties_in_sglang_order_and_counting() -> None:
    """Additive penalties, then the min_new_tokens mask, then repetition, then the bias."""
    params = [
        SamplingParams(
            frequency_penalty=0.5,
            presence_penalty=0.25,
            repetition_penalty=2.0,
            min_new_tokens=4,
            logit_bias={3: 1.5},
        ),  # fmt: skip
        SamplingParams(),  # a default row keeps its logits exactly
    ]
    histories = [[1, 1, 2], [1, 1, 2]]
    held = [frozenset({0}), frozenset({0})]
    penalties = RoundPenalties.build(params, histories, held, [3, 3], 4, torch.device("cpu"))
    assert penalties is not None
    out = penalties.apply(LOGITS.repeat(2, 1))
    # row 0: token 0 held (3 < 4 generated); token 1: (2 - 1.25) / 2; token 2: (-1.75) * 2;
    # token 3: 0.5 + 1.5
    torch.testing.assert_close(out[0], torch.tensor([-math.inf, 0.375, -3.5, 2.0]))
    torch.testing.assert_close(out[1], LOGITS[0])
    penalties.record(torch.tensor([3, 3]))  # 4 generated: token 0 is free again
    out = penalties.apply(LOGITS.repeat(2, 1))
    # token 3 generated once: 0.5 - 0.5 - 0.25 < 0, so doubled, then the bias
    assert out[0, 0] == 1.0 and out[0, 3] == (0.5 - 0.75) * 2.0 + 1.5


def test_defaults_build_nothing() -> None:
    params = [SamplingParams(), SamplingParams(temperature=0.0)]
    cpu = torch.device("cpu")
    assert RoundPenalties.build(params, [[1], []], [frozenset()] * 2, [1, 0], 4, cpu) is None


def test_min_p_drops_tokens_below_the_threshold() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = truncate_logits(logits, torch.tensor([4]), torch.tensor([1.0]), torch.tensor([0.5]))
    # threshold 0.5 * 0.5 = 0.25: 0.5 and 0.3 stay
    assert torch.isfinite(kept[0]).tolist() == [True, True, False, False]
    one = truncate_logits(logits, torch.tensor([4]), torch.tensor([1.0]), torch.tensor([1.0]))
    assert torch.isfinite(one[0]).tolist() == [True, False, False, False]


@pytest.mark.parametrize(
    ("params", "name"),
    [
        (SamplingParams(min_p=1.5), "min_p"),
        (SamplingParams(frequency_penalty=float("nan")), "frequency_penalty"),
        (SamplingParams(presence_penalty=-2.5), "presence_penalty"),
        (SamplingParams(repetition_penalty=0.0), "repetition_penalty"),
        (SamplingParams(min_new_tokens=-1), "min_new_tokens"),
        (SamplingParams(logit_bias={1: float("inf")}), "logit_bias"),
    ],
)
def test_engine_side_checks(params, name) -> None:
    with pytest.raises(ValueError, match=name):
        validate_sampling(params)


def test_a_resumed_request_is_penalised_as_if_never_interrupted(engine, prompts) -> None:
    """An abort mid-request resubmits prompt + partial output: the penalties still count the
    partial output as generated (``resumed_tokens``), so greedy tokens are the same."""
    sampling = SamplingParams(max_new_tokens=24, temperature=0.0, frequency_penalty=1.0,
                              repetition_penalty=1.5, min_new_tokens=20)  # fmt: skip

    async def main():
        whole = await engine.agenerate(GenerationRequest(prompts[0], sampling))
        task = asyncio.create_task(
            generate_resuming(engine, GenerationRequest(prompts[0], sampling))
        )
        await wait_for_tokens(engine, 5)
        await engine.pause("abort")
        await engine.resume()
        return whole, await task

    whole, resumed = run(main())
    assert resumed.n_resumes >= 1 and 0 < len(resumed.output_ids)
    assert resumed.output_ids == whole.output_ids
    torch.testing.assert_close(
        torch.tensor(resumed.logprobs), torch.tensor(whole.logprobs), atol=1e-4, rtol=0
    )
