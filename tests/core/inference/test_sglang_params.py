"""SGLang's ``/generate`` schema over raw HTTP: every field a SGLang client may send.

A real server (aiohttp on 127.0.0.1, the tiny model, which has a tokenizer with eos id 2) gets
the bodies SGLang clients send. The untrained model's greedy output repeats one token, which is
what the penalty tests need; ``logit_bias`` on eos makes eos the greedy token at every step, so
``ignore_eos`` and ``min_new_tokens`` have an eos to act on. Before the SGLang fields were
accepted, every one of these requests was a 400 "unknown field(s)".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.core.inference.helpers import ServerThread

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7] * 3
EOS = 2


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Any]:
    threads = ServerThread()
    try:
        handle = threads.start(model_dir=model_dir, seed=0)
        assert handle.engine.eos_token_ids == {EOS}
        yield handle
    finally:
        threads.close()


def generate(server, http, sampling: dict[str, Any], **body: Any) -> Any:
    payload = {"input_ids": PROMPT, "sampling_params": sampling, "return_logprob": True, **body}
    response = http.post(server.url + "/generate", json=payload)
    assert response.status_code == 200, response.text
    return response.json()


def rejected(server, http, body: dict[str, Any]) -> str:
    response = http.post(server.url + "/generate", json={"input_ids": PROMPT, **body})
    assert response.status_code == 400, response.text
    return response.json()["error"]["message"]


def greedy(n: int, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0, "max_new_tokens": n, **extra}


FORCE_EOS = {"logit_bias": {str(EOS): 50.0}}


# ---------------------------------------------------------------------- stopping


def test_ignore_eos_generates_past_eos_to_max_new_tokens(server, http) -> None:
    stopped = generate(server, http, greedy(6, **FORCE_EOS))
    assert stopped["output_ids"] == [EOS]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    ignored = generate(server, http, greedy(6, **FORCE_EOS, ignore_eos=True))
    assert ignored["output_ids"] == [EOS] * 6
    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_ignore_eos_also_ignores_stop_token_ids_as_sglang_does(server, http) -> None:
    free = generate(server, http, greedy(6))["output_ids"]
    first = free[0]
    assert generate(server, http, greedy(6, stop_token_ids=[first]))["output_ids"] == [first]
    ignoring = greedy(6, stop_token_ids=[first], ignore_eos=True)
    assert generate(server, http, ignoring)["output_ids"] == free


def test_min_new_tokens_holds_back_eos_and_stop_tokens(server, http) -> None:
    answer = generate(server, http, greedy(10, **FORCE_EOS, min_new_tokens=4))
    ids = answer["output_ids"]
    assert len(ids) == 5 and EOS not in ids[:4] and ids[4] == EOS
    assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    # the held-back distribution is what was sampled from: its logprobs, not eos's ~0
    assert all(t[0] < -1 for t in answer["meta_info"]["output_token_logprobs"][:4])
    free = generate(server, http, greedy(6))["output_ids"]
    held = generate(server, http, greedy(6, stop_token_ids=[free[0]], min_new_tokens=3))
    assert free[0] not in held["output_ids"][:3] and len(held["output_ids"]) > 3


# ---------------------------------------------------------------------- penalties and min_p


def _hand_penalised_greedy(model, prompt: list[int], n: int, penalise) -> tuple[list, list]:
    """Greedy decoding with ``penalise(logits, counts)`` applied by hand at every step."""
    output: list[int] = []
    logprobs: list[float] = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0, -1].float()
        counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=len(logits))
        processed = penalise(logits, counts[: len(logits)].float())
        token = int(processed.argmax())
        output.append(token)
        logprobs.append(float(torch.log_softmax(processed, -1)[token]))
    return output, logprobs


@pytest.mark.parametrize(
    ("field", "value", "penalise"),
    [
        ("frequency_penalty", 2.0, lambda logits, c: logits - 2.0 * c),
        ("presence_penalty", 2.0, lambda logits, c: logits - 2.0 * (c > 0)),
        (
            "repetition_penalty",
            2.0,
            lambda logits, c: torch.where(
                c > 0, torch.where(logits < 0, logits * 2.0, logits / 2.0), logits
            ),
        ),
    ],
)
def test_penalties_change_the_greedy_output_of_a_repeating_prompt(
    server, http, ref_model, field, value, penalise
) -> None:
    plain = generate(server, http, greedy(12))["output_ids"]
    assert max(Counter(plain).values()) >= 8  # the untrained model repeats itself
    answer = generate(server, http, greedy(12, **{field: value}))
    penalised = answer["output_ids"]
    assert penalised != plain
    assert max(Counter(penalised).values()) < max(Counter(plain).values())
    expected, logprobs = _hand_penalised_greedy(ref_model, PROMPT, 12, penalise)
    assert penalised == expected
    returned = [t[0] for t in answer["meta_info"]["output_token_logprobs"]]
    # the log-probs of the penalised distribution the tokens were picked from
    torch.testing.assert_close(torch.tensor(returned), torch.tensor(logprobs), atol=1e-4, rtol=0)


def test_min_p_close_to_one_samples_greedily(server, http) -> None:
    plain = generate(server, http, greedy(8))["output_ids"]
    for seed in range(4):
        sampled = {"temperature": 1.0, "max_new_tokens": 8, "sampling_seed": seed}
        assert generate(server, http, {**sampled, "min_p": 0.999})["output_ids"] == plain
    free = [generate(server, http, {**sampled, "sampling_seed": s})["output_ids"] for s in range(4)]
    assert any(f != plain for f in free)  # without min_p the same seeds do sample


def test_seeded_penalised_tokens_do_not_depend_on_the_batch(server, http) -> None:
    sampling = {"temperature": 1.0, "max_new_tokens": 8, "sampling_seed": 11,
                "frequency_penalty": 1.5, "min_p": 0.05}  # fmt: skip
    alone = generate(server, http, sampling)["output_ids"]
    body = {"input_ids": [PROMPT, [9, 10, 11], PROMPT[:4]], "sampling_params": sampling}
    batch = http.post(server.url + "/generate", json=body).json()
    assert batch[0]["output_ids"] == alone


# ---------------------------------------------------------------------- n


def test_n_returns_n_results_prompt_by_prompt(server, http) -> None:
    answers = generate(server, http, {"max_new_tokens": 8, "n": 3}, rid="abc")
    assert isinstance(answers, list) and len(answers) == 3
    assert [a["meta_info"]["id"] for a in answers] == ["abc_0", "abc_1", "abc_2"]
    assert all(len(a["output_ids"]) == 8 for a in answers)
    assert len({tuple(a["output_ids"]) for a in answers}) > 1  # three samples, not one
    seeded = generate(server, http, {"max_new_tokens": 8, "n": 3, "sampling_seed": 3})
    assert len({tuple(a["output_ids"]) for a in seeded}) == 1  # one seed: SGLang's samples too
    body = {"input_ids": [PROMPT, [9, 10]], "sampling_params": {"max_new_tokens": 2, "n": 2}}
    batch = http.post(server.url + "/generate", json=body).json()
    assert [a["meta_info"]["prompt_tokens"] for a in batch] == [9, 9, 2, 2]


# ---------------------------------------------------------------------- the text


def test_text_follows_skip_special_tokens(server, http, tokenizer) -> None:
    eos_text = tokenizer.decode([EOS], skip_special_tokens=False)
    assert eos_text
    forced = greedy(3, **FORCE_EOS, ignore_eos=True)
    assert generate(server, http, forced)["text"] == ""  # SGLang's default: skipped
    kept = generate(server, http, {**forced, "skip_special_tokens": False})
    assert kept["text"] == eos_text * 3
    spaced = {**forced, "skip_special_tokens": False, "spaces_between_special_tokens": False}
    assert generate(server, http, spaced)["text"] == tokenizer.decode(
        [EOS] * 3, skip_special_tokens=False, spaces_between_special_tokens=False
    )
    plain = generate(server, http, greedy(4), return_text_in_logprobs=True)
    assert plain["text"] == tokenizer.decode(plain["output_ids"])
    texts = [t[2] for t in plain["meta_info"]["output_token_logprobs"]]
    assert texts == [tokenizer.decode([t]) for t in plain["output_ids"]]
    eos_logprobs = generate(server, http, forced, return_text_in_logprobs=True)["meta_info"]
    assert [t[2] for t in eos_logprobs["output_token_logprobs"]] == [eos_text] * 3


# ---------------------------------------------------------------------- what is refused


def test_the_body_sglangs_router_forwards_is_accepted(server, http) -> None:
    """What sglang-router 0.3.2 sends for ``{"input_ids", "sampling_params"}`` (captured)."""
    body = {"model": None, "input_ids": PROMPT, "sampling_params": greedy(4),
            "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
            "return_hidden_states": False, "background": False, "no_logs": False,
            "return_bytes": False, "return_entropy": False}  # fmt: skip
    response = http.post(server.url + "/generate", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["output_ids"]) == 4


@pytest.mark.parametrize(
    ("sampling", "body", "field"),
    [
        ({"regex": "a+"}, {}, "sampling_params.regex"),
        ({"json_schema": "{}"}, {}, "sampling_params.json_schema"),
        ({"ebnf": "root ::= 'a'"}, {}, "sampling_params.ebnf"),
        ({"structural_tag": "{}"}, {}, "sampling_params.structural_tag"),
        ({"stop_regex": "a+"}, {}, "sampling_params.stop_regex"),
        ({"beam_width": 4}, {}, "sampling_params.beam_width"),
        ({}, {"return_hidden_states": True}, "return_hidden_states"),
        ({}, {"top_logprobs_num": 5}, "top_logprobs_num"),
        ({}, {"image_data": "http://x/cat.png"}, "image_data"),
        ({}, {"lora_path": "adapter"}, "lora_path"),
        ({}, {"logprob_start_len": 0}, "logprob_start_len"),
        ({}, {"sampling_logprobs_mode": "support"}, "sampling_logprobs_mode"),
        ({"min_pp": 0.1}, {}, "sampling_params.min_pp"),
        ({}, {"extra": 1}, "extra"),
        ({"min_p": 1.5}, {}, "min_p"),
        ({"frequency_penalty": 2.5}, {}, "frequency_penalty"),
        ({"presence_penalty": -3}, {}, "presence_penalty"),
        ({"repetition_penalty": 0}, {}, "repetition_penalty"),
        ({"max_new_tokens": 4, "min_new_tokens": 5}, {}, "min_new_tokens"),
        ({"n": 0}, {}, "n"),
        ({"logit_bias": {"999999": 1.0}}, {}, "logit_bias"),
        ({"logit_bias": {"a": 1.0}}, {}, "logit_bias"),
        ({"logit_bias": {"5": "x"}}, {}, "logit_bias"),
        ({"ignore_eos": "yes"}, {}, "ignore_eos"),
        ({"skip_special_tokens": 1}, {}, "skip_special_tokens"),
    ],
)
def test_what_is_refused_is_named(server, http, sampling, body, field) -> None:
    assert field in rejected(server, http, {"sampling_params": sampling, **body})


def test_unsupported_features_at_their_defaults_are_accepted(server, http) -> None:
    sampling = greedy(2, regex=None, json_schema=None, ebnf=None, structural_tag=None,
                      stop_regex=[], custom_params={"a": 1}, stream_interval=4)  # fmt: skip
    body = {"return_hidden_states": False, "top_logprobs_num": 0, "image_data": None,
            "lora_path": None, "logprob_start_len": -1, "token_ids_logprob": None,
            "custom_labels": {"team": "rl"}, "routed_dp_rank": 0}  # fmt: skip
    assert len(generate(server, http, sampling, **body)["output_ids"]) == 2


def test_n_must_agree_across_a_batch(server, http) -> None:
    body = {"input_ids": [PROMPT, [9]], "sampling_params": [{"n": 2}, {"n": 3}]}
    response = http.post(server.url + "/generate", json=body)
    assert response.status_code == 400 and "sampling_params.n" in response.text
