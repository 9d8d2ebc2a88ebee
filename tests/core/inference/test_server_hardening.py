"""The engine server stays up: validation, isolation of bad requests, auth, weight-update rules.

A Hypothesis fuzz sends random and malformed bodies to the running server (real aiohttp on
127.0.0.1, tiny model) while well-formed "bystander" requests keep flowing; no body may get a
5xx and every bystander must succeed. The targeted tests each reproduce one probe finding that
failed before the server validated its input.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.inference.api import GenerationRequest, SamplingParams
from core.inference.clients.http_client import ServerError
from core.inference.clients.sglang_client import SGLangClient
from core.inference.clients.sglang_launcher import SGLangLaunchSpec, build_command
from core.inference.engine.hf_engine import GenerationError, HFEngine
from core.inference.server.app import parse_args, start_server
from core.inference.server.guard import check_exposure, is_loopback
from core.inference.server.validation import MAX_WEIGHT_VERSION
from core.models import load_model
from tests.core.inference.helpers import ServerThread, run

pytestmark = pytest.mark.integration

VOCAB = 306  # the tiny model's embedding rows (tokenizer of 300 + specials)
CAP = 8  # the fuzzed server's --max-new-tokens-cap: valid fuzz requests stay cheap
KEY = "test-key-0123456789"
GOOD = {
    "input_ids": [5, 6, 7],
    "sampling_params": {"max_new_tokens": 6, "temperature": 0.0},
    "return_logprob": True,
}


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Any]:
    """One server for the validation tests: loopback, no key, max_new_tokens capped at ``CAP``."""
    threads = ServerThread()
    try:
        yield threads.start(model_dir=model_dir, max_new_tokens_cap=CAP, seed=0)
    finally:
        threads.close()


def post(http: httpx.Client, url: str, body: Any = None, raw: bytes | None = None, **kw: Any):
    if raw is not None:
        return http.post(url, content=raw, headers={"Content-Type": "application/json"}, **kw)
    return http.post(url, json=body, **kw)


def assert_rejected(response: httpx.Response, field: str, status: int = 400) -> None:
    assert response.status_code == status, response.text
    assert field in response.json()["error"]["message"], response.text


# ---------------------------------------------------------------------- bystanders


class Bystanders:
    """Well-formed requests (single and batched) sent in a loop on their own thread."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.ok = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Bystanders:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "bystanders hung"

    async def _main(self) -> None:
        async with aiohttp.ClientSession(headers=self.headers) as session:
            while not self.stop.is_set():
                bodies = [GOOD, {**GOOD, "input_ids": [[5, 6, 7], [9, 10], [11]]}]
                bodies += [{**GOOD, "input_ids": [20 + i, 30 + i]} for i in range(4)]
                await asyncio.gather(*(self._one(session, b) for b in bodies))

    async def _one(self, session: aiohttp.ClientSession, body: dict) -> None:
        try:
            async with session.post(self.url + "/generate", json=body) as r:
                data = await r.json(content_type=None)
                answers = data if isinstance(data, list) else [data]
                if r.status != 200 or not all(_well_formed(a) for a in answers):
                    self.failures.append(f"{r.status}: {str(data)[:200]}")
                else:
                    self.ok += 1
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.failures.append(repr(exc))


def _well_formed(answer: dict) -> bool:
    meta = answer["meta_info"]
    return (
        meta["finish_reason"]["type"] in ("length", "stop")
        and 1 <= len(answer["output_ids"]) <= 6
        and all(math.isfinite(t[0]) and t[0] <= 0 for t in meta["output_token_logprobs"])
    )


# ---------------------------------------------------------------------- the fuzz

_HUGE = st.integers(min_value=-(2**80), max_value=2**80)
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    _HUGE,
    st.integers(-3, 12),
    st.sampled_from(["nan", "inf", "-1", "1e999", "", "7"]),
    st.booleans(),
    st.none(),
)
_IDS = st.one_of(st.integers(0, VOCAB - 1), st.integers(-5, VOCAB + 5), _NUMBERS)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), _HUGE, st.floats(), st.text(max_size=8)),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
_SAMPLING = st.fixed_dictionaries(
    {},
    optional={
        "max_new_tokens": st.one_of(st.integers(0, CAP), _NUMBERS),
        "temperature": st.one_of(st.sampled_from([0.0, 0.7, 1.0]), _NUMBERS),
        "top_p": st.one_of(st.sampled_from([0.5, 1.0]), _NUMBERS),
        "top_k": st.one_of(st.sampled_from([-1, 0, 5]), _NUMBERS),
        "stop_token_ids": st.one_of(st.lists(_IDS, max_size=3), _JSON),
        "sampling_seed": _NUMBERS,
        "stop": st.one_of(st.none(), st.text(max_size=3), _JSON),
        "frequency_penalty": _NUMBERS,
        "repetition_penalty": _NUMBERS,
        "min_p": _NUMBERS,
        "min_new_tokens": _NUMBERS,
        "n": st.one_of(st.integers(0, 3), _NUMBERS),
        "ignore_eos": st.one_of(st.booleans(), _JSON),
        "logit_bias": st.one_of(
            st.dictionaries(st.sampled_from(["0", "5", "305", "306", "-1", "05", "x"]), _NUMBERS),
            _JSON,
        ),
        "regex": st.one_of(st.none(), st.text(max_size=3)),
    },
)
_GENERATE = st.fixed_dictionaries(
    {},
    optional={
        "input_ids": st.one_of(
            st.lists(_IDS, max_size=6),
            st.lists(st.lists(_IDS, max_size=4), max_size=3),
            _JSON,
        ),
        "sampling_params": st.one_of(_SAMPLING, st.lists(_SAMPLING, max_size=3), _JSON),
        "rid": st.one_of(st.none(), st.text(max_size=6), st.lists(st.text(max_size=3)), _JSON),
        "return_logprob": st.one_of(st.booleans(), _JSON),
        "stream": st.one_of(st.booleans(), _JSON),
        "priority": st.one_of(st.integers(), st.lists(st.integers(), max_size=3), _JSON),
        "text": st.text(max_size=5),
    },
)
_UPDATE = st.fixed_dictionaries(
    {},
    optional={
        "model_path": st.one_of(st.text(max_size=20), st.sampled_from(["/", "..", "/etc"]), _JSON),
        "weight_version": st.one_of(_NUMBERS, st.text(max_size=4)),
        "abort_all_requests": st.one_of(st.booleans(), _JSON),
    },
)
_PAUSE = st.one_of(
    _JSON.filter(lambda v: not isinstance(v, dict)),
    st.fixed_dictionaries({"mode": st.one_of(st.text(max_size=8), _NUMBERS)}).filter(
        lambda d: d["mode"] not in ("abort", "retract", "in_place")
    ),
    st.fixed_dictionaries({"mode": st.sampled_from(["abort"]), "junk": _JSON}),
)
_SENT: list[str] = []  # paths fuzzed, to check that the fuzz did run
_ENDPOINTS = ["/generate", "/update_weights_from_disk", "/continue_generation", "/nowhere"]
_CASES = st.one_of(
    st.tuples(st.just("/generate"), _GENERATE.map(json.dumps)),
    st.tuples(st.just("/generate"), _JSON.map(json.dumps)),
    st.tuples(st.just("/update_weights_from_disk"), _UPDATE.map(json.dumps)),
    st.tuples(st.just("/pause_generation"), _PAUSE.map(json.dumps)),
    st.tuples(st.sampled_from(_ENDPOINTS), st.binary(max_size=48)),
)


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=_CASES)
def _fuzz_one(server, http: httpx.Client, case: tuple[str, str | bytes]) -> None:
    path, body = case
    _SENT.append(path)
    raw = body if isinstance(body, bytes) else body.encode()
    response = post(http, server.url + path, raw=raw)
    assert response.status_code < 500, (path, body, response.text)
    if response.status_code in (400, 409):  # ours (aiohttp's own 404s are plain text)
        assert response.json()["error"]["message"], response.text


def test_fuzzed_bodies_never_5xx_and_bystanders_succeed(server, http) -> None:
    with Bystanders(server.url) as bystanders:
        _fuzz_one(server, http)
    assert not bystanders.failures, bystanders.failures[:5]
    assert bystanders.ok > 0 and len(_SENT) >= 100, (bystanders.ok, len(_SENT))
    print(f"fuzzed {len(_SENT)} bodies; {bystanders.ok} bystander requests succeeded")
    assert not server.engine.paused and server.engine.version == 0
    assert post(http, server.url + "/generate", GOOD).status_code == 200


# ---------------------------------------------------------------------- probe findings


BAD_BODIES = {
    "temperature-nan-string": ({"sampling_params": {"temperature": "nan"}}, "temperature"),
    "temperature-huge": ({"sampling_params": {"temperature": 1e5}}, "temperature"),
    "top-p-zero": ({"sampling_params": {"top_p": 0}}, "top_p"),
    "top-k-float": ({"sampling_params": {"top_k": 1.5}}, "top_k"),
    "oov-id": ({"input_ids": [5, 6, 100_000]}, "input_ids[2]"),
    "negative-id": ({"input_ids": [5, -6, 7]}, "input_ids[1]"),
    "float-id": ({"input_ids": [5.0, 6, 7]}, "input_ids[0]"),
    "bool-id": ({"input_ids": [True, 6]}, "input_ids[0]"),
    "string-id": ({"input_ids": ["5", 6]}, "input_ids[0]"),
    "huge-id": ({"input_ids": [2**70]}, "input_ids[0]"),
    "oov-stop-id": ({"sampling_params": {"stop_token_ids": [VOCAB]}}, "stop_token_ids[0]"),
    "huge-max-new-tokens": ({"sampling_params": {"max_new_tokens": 10**12}}, "max_new_tokens"),
    "unknown-sampling-field": ({"sampling_params": {"min_pp": 0.1}}, "min_pp"),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_bad_request_fails_alone(server, name) -> None:
    """Before: an out-of-vocabulary id failed every request of its batch with a 500."""
    patch, field = BAD_BODIES[name]
    bad = {**GOOD, **patch}
    if "sampling_params" in patch:
        bad["sampling_params"] = {**GOOD["sampling_params"], **patch["sampling_params"]}

    async def main():
        async with aiohttp.ClientSession() as s:

            async def send(body):
                async with s.post(server.url + "/generate", json=body) as r:
                    return r.status, await r.json()

            goods = [{**GOOD, "input_ids": [10 + i, 11, 12]} for i in range(12)]
            return await asyncio.gather(*(send(b) for b in [*goods[:6], bad, *goods[6:]]))

    results = run(main())
    status, answer = results.pop(6)
    assert status == 400 and field in answer["error"]["message"], answer
    assert [s for s, _ in results] == [200] * 12
    assert all(len(a["output_ids"]) <= 6 for _, a in results)


MALFORMED = [
    b"{bad",
    b"[1, 2]",
    b"null",
    b"",
    b"\xff\xfe\x00",
    b"[" * 100_000,
    b'{"input_ids": [' + b"9" * 5000 + b"]}",
    b'{"input_ids": [5], "sampling_params": {"temperature": NaN}}',
    b'{"input_ids": [5], "sampling_params": {"temperature": 1e999}}',  # parses as inf
    b'{"input_ids": [[5], 6]}',
    b'{"input_ids": [[]]}',
]


def test_malformed_bodies_are_400_and_do_not_stall_the_server(server, http) -> None:
    """Before: 500s, and 20 of them froze the server for seconds."""
    start = time.perf_counter()
    for _ in range(2):
        for raw in MALFORMED:
            response = post(http, server.url + "/generate", raw=raw)
            assert response.status_code == 400, (raw[:40], response.text)
            assert response.json()["error"]["message"]
    assert time.perf_counter() - start < 10
    start = time.perf_counter()
    assert http.get(server.url + "/health").status_code == 200
    assert post(http, server.url + "/generate", GOOD).status_code == 200
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sampling_params": {"max_new_tokens": CAP + 1}}, "max_new_tokens"),
        ({"sampling_params": {"max_new_tokens": 5.0}}, "max_new_tokens"),
        ({"sampling_params": {"max_new_tokens": True}}, "max_new_tokens"),
        ({"sampling_params": {"max_new_tokens": "5"}}, "max_new_tokens"),
        ({"sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"sampling_params": {"temperature": 1e-9}}, "temperature"),
        ({"sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"sampling_params": {"top_k": -2}}, "top_k"),
        ({"sampling_params": {"top_k": True}}, "top_k"),
        ({"sampling_params": {"sampling_seed": "7"}}, "sampling_seed"),
        ({"sampling_params": {"stop": [""]}}, "stop"),
        ({"sampling_params": {"stop_token_ids": [1.0]}}, "stop_token_ids[0]"),
        ({"sampling_params": [{}]}, "sampling_params"),
        ({"input_ids": [[1, 2], [3]], "sampling_params": [{}]}, "sampling_params"),
        ({"input_ids": [[1, 2], [3]], "rid": ["a"]}, "rid"),
        ({"input_ids": [[1]] * 1025}, "input_ids"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": None}, "input_ids"),
        ({"rid": 5}, "rid"),
        ({"priority": "high"}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 2**63}, "priority"),
        ({"input_ids": [[1, 2], [3]], "priority": [1]}, "priority"),
        ({"return_logprob": "yes"}, "return_logprob"),
        ({"stream": True}, "stream"),
        ({"text": "hi"}, "text"),
        ({"extra": 1}, "extra"),
    ],
)
def test_fields_are_validated_and_named(server, http, body, field) -> None:
    assert_rejected(post(http, server.url + "/generate", {**GOOD, **body}), field)


def test_max_new_tokens_cap_and_context_limit(server, servers, model_dir, http) -> None:
    """The server's cap bounds explicit and default budgets; without one, the context does."""
    capped = post(http, server.url + "/generate", {"input_ids": [5, 6]}).json()
    assert capped["meta_info"]["completion_tokens"] <= CAP  # default 128, lowered to the cap
    assert post(http, server.url + "/generate", {**GOOD, "sampling_params": {
        "max_new_tokens": CAP}}).status_code == 200  # fmt: skip
    plain = servers.start(model_dir=model_dir)
    context = plain.engine.context_length
    assert context == 2048 and http.get(plain.url + "/get_server_info").json()["context_length"]
    prompt = [7] * (context - 3)
    for budget, status in ((3, 200), (4, 400)):
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": budget}}
        response = post(http, plain.url + "/generate", body)
        assert response.status_code == status, response.text
    assert_rejected(post(http, plain.url + "/generate", {"input_ids": [7] * context}), "input_ids")


def test_pause_body_is_validated(server, http) -> None:
    for raw in (b"[1]", b"null", b'{"mode": "stop"}', b'{"mode": 1}', b'{"mode": "abort", "x": 1}'):
        response = post(http, server.url + "/pause_generation", raw=raw)
        assert response.status_code == 400, (raw, response.text)
    assert not server.engine.paused


# ---------------------------------------------------------------------- the engine itself


def test_engine_checks_ids_and_sampling_before_queueing(engine) -> None:
    async def main():
        for ids in ([5, 100_000], [5, -1], [5.0, 6], [True, 5], ["5"], []):
            with pytest.raises(ValueError, match="input_ids"):
                await engine.agenerate(GenerationRequest(ids, SamplingParams(max_new_tokens=2)))
        for sampling, name in (
            (SamplingParams(temperature=float("nan")), "temperature"),
            (SamplingParams(top_p=float("inf")), "top_p"),
            (SamplingParams(top_k=2.5), "top_k"),  # type: ignore[arg-type]
            (SamplingParams(max_new_tokens=2.0), "max_new_tokens"),  # type: ignore[arg-type]
            (SamplingParams(stop_token_ids=[-3]), "stop_token_ids"),
        ):
            with pytest.raises(ValueError, match=name):
                await engine.agenerate(GenerationRequest([5, 6], sampling))
        return await engine.agenerate(GenerationRequest([5, 6], SamplingParams(max_new_tokens=3)))

    assert len(run(main()).output_ids) <= 3
    assert engine.num_waiting == 0


POISON = 299


def _poisoned_forward(model, fail_when):
    forward = model.forward

    def wrapped(*args, **kwargs):
        if fail_when(kwargs["input_ids"]):
            raise RuntimeError("poisoned row")
        return forward(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("failure", ["one-request", "transient"])
def test_a_failing_request_in_the_decode_loop_fails_alone(model_dir, prompts, failure) -> None:
    """A forward pass that raises for one row (here: any row holding ``POISON``) fails that
    request only; a transient failure of a round fails nobody."""
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    chosen = [p for p in prompts if POISON not in p][:6]
    with HFEngine(load_model(model_dir), None, max_batch_size=16, seed=0) as engine:
        expected = run(_all(engine, chosen, greedy))
        assert not any(POISON in r.output_ids for r in expected)
        calls = {"n": 0}

        def fail_when(ids: torch.Tensor) -> bool:
            calls["n"] += 1
            if failure == "transient":
                return calls["n"] == 3
            return bool((ids == POISON).any())

        engine.model.forward = _poisoned_forward(engine.model, fail_when)
        bad = [chosen[0][:-1] + [POISON]] if failure == "one-request" else []
        results = run(_all(engine, [*chosen[:3], *bad, *chosen[3:]], greedy, settle=True))
    if bad:
        error = results.pop(3)
        assert isinstance(error, GenerationError) and "poisoned row" in str(error)
    assert [r.output_ids for r in results] == [r.output_ids for r in expected]


async def _all(engine: HFEngine, chosen: list[list[int]], sampling, settle: bool = False):
    requests = [engine.agenerate(GenerationRequest(p, sampling)) for p in chosen]
    return await asyncio.gather(*requests, return_exceptions=settle)


# ---------------------------------------------------------------------- weight updates


def _update(http: httpx.Client, url: str, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return http.post(url + "/update_weights_from_disk", json=body, headers=headers)


@pytest.fixture
def outside_copy(new_model_dir: Path) -> Iterator[Path]:
    """The version-1 weights in a folder outside the model folder's parent."""
    folder = Path(tempfile.mkdtemp(prefix="outside-weights-")) / "v1"
    shutil.copytree(new_model_dir, folder)
    yield folder
    shutil.rmtree(folder.parent, ignore_errors=True)


def test_weight_updates_only_from_allowed_roots(
    servers, model_dir, new_model_dir, outside_copy, tmp_path, http
) -> None:
    """Before: any local path was loaded."""
    handle = servers.start(model_dir=model_dir)
    link = tmp_path / "link"  # inside the allowed root, pointing outside it
    link.symlink_to(outside_copy, target_is_directory=True)
    for path in (outside_copy, link, "/etc", "s3://bucket/w", str(model_dir) + "/../../x"):
        response = _update(http, handle.url, {"model_path": str(path)})
        assert_rejected(response, "model_path")
        assert response.json()["success"] is False
    assert handle.engine.version == 0
    ok = _update(http, handle.url, {"model_path": f"file://{new_model_dir}"})
    assert ok.status_code == 200 and handle.engine.version == 1

    extra = servers.start(
        model_dir=model_dir, weights_root=[outside_copy.parent, "s3://bucket/run/weights"]
    )
    assert _update(http, extra.url, {"model_path": str(outside_copy)}).status_code == 200
    assert extra.engine.version == 1
    # a URL root admits URLs under it only (the positive case: the S3 resume test in test_trainer)
    for url in (
        "s3://bucket/run/weightsX/v1",
        "s3://bucket/other/v1",
        "s3://bucket/run/weights/../x",
    ):
        assert_rejected(_update(http, extra.url, {"model_path": url}), "model_path")
    assert extra.engine.version == 1


def test_weight_versions_move_forward(servers, model_dir, new_model_dir, http) -> None:
    """Before: any weight_version (-7, 10**12) was taken."""
    handle = servers.start(model_dir=model_dir)
    path = str(new_model_dir)
    for version in (-7, "-7", 10**12, MAX_WEIGHT_VERSION + 1, "1e3", "3.0", 1.5, True, [3]):
        assert_rejected(
            _update(http, handle.url, {"model_path": path, "weight_version": version}),
            "weight_version",
        )
    assert_rejected(_update(http, handle.url, {"model_path": path, "junk": 1}), "junk")
    assert_rejected(
        _update(http, handle.url, {"model_path": path, "abort_all_requests": "yes"}),
        "abort_all_requests",
    )
    assert handle.engine.version == 0
    assert _update(http, handle.url, {"model_path": path, "weight_version": "3"}).status_code == 200
    assert handle.engine.version == 3
    assert_rejected(
        _update(http, handle.url, {"model_path": path, "weight_version": 2}), "weight_version", 409
    )
    assert_rejected(  # equal version, other folder
        _update(http, handle.url, {"model_path": str(model_dir), "weight_version": 3}),
        "weight_version",
        409,
    )
    retry = _update(http, handle.url, {"model_path": path, "weight_version": "3"})
    assert retry.status_code == 200 and handle.engine.version == 3  # a retried update reloads
    assert _update(http, handle.url, {"model_path": path}).status_code == 200
    assert handle.engine.version == 4
    # a run's first weights: any version, backwards included (our extension)
    reset = {"model_path": str(model_dir), "weight_version": 1, "reset_version": True}
    assert _update(http, handle.url, reset).status_code == 200 and handle.engine.version == 1
    assert_rejected(_update(http, handle.url, {**reset, "weight_version": None}), "weight_version")
    assert_rejected(_update(http, handle.url, {**reset, "reset_version": 1}), "reset_version")
    assert handle.engine.version == 1


# ---------------------------------------------------------------------- authentication


def test_api_key_guards_every_endpoint_but_health(
    servers, model_dir, new_model_dir, http, monkeypatch
) -> None:
    """Before: no authentication, so anyone reaching the port could pause or swap weights."""
    handle = servers.start(model_dir=model_dir, api_key=KEY)
    url = handle.url
    assert http.get(url + "/health").status_code == 200
    assert http.get(url + "/health_generate").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
        for method, path in [
            ("POST", "/generate"),
            ("POST", "/pause_generation"),
            ("POST", "/continue_generation"),
            ("POST", "/update_weights_from_disk"),
            ("GET", "/get_model_info"),
            ("GET", "/get_server_info"),
            ("GET", "/get_weight_version"),
        ]:
            body = {"model_path": str(new_model_dir)} if "update" in path else GOOD
            r = http.request(method, url + path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.headers["WWW-Authenticate"] == "Bearer"
    assert not handle.engine.paused and handle.engine.version == 0
    ok = http.post(url + "/generate", json=GOOD, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200

    request = GenerationRequest([5, 6, 7], SamplingParams(max_new_tokens=3, temperature=0.0))

    async def generate(**kwargs):
        async with SGLangClient([handle.address], max_retries=0, **kwargs) as client:
            return await client.agenerate(request)

    monkeypatch.delenv("ASYNCRL_ENGINE_API_KEY", raising=False)
    assert len(run(generate(api_key=KEY)).output_ids) <= 3
    with pytest.raises(ServerError, match="401"):
        run(generate())
    monkeypatch.setenv("ASYNCRL_ENGINE_API_KEY", KEY)  # what a run's client picks up
    assert len(run(generate()).output_ids) <= 3
    with pytest.raises(ServerError, match="401"):
        run(generate(api_key=""))  # "" = send no key, whatever the environment says


def test_bystanders_with_a_key_survive_unauthenticated_noise(servers, model_dir, http) -> None:
    handle = servers.start(model_dir=model_dir, api_key=KEY, max_new_tokens_cap=CAP)
    with Bystanders(handle.url, api_key=KEY) as bystanders:
        for raw in MALFORMED * 3:
            assert post(http, handle.url + "/generate", raw=raw).status_code == 401
            time.sleep(0.01)
    assert not bystanders.failures and bystanders.ok > 0


def test_non_loopback_bind_needs_a_key(engine, model_dir, monkeypatch, capsys) -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "", "::", "10.1.2.3", "example.com"))
    check_exposure("0.0.0.0", KEY)  # fine with a key
    with pytest.raises(ValueError, match="--api-key"):
        run(start_server(engine=engine, host="0.0.0.0"))  # refused before binding anything
    monkeypatch.delenv("ASYNCRL_ENGINE_API_KEY", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--model", str(model_dir), "--host", "0.0.0.0"])
    assert "--api-key" in capsys.readouterr().err
    monkeypatch.setenv("ASYNCRL_ENGINE_API_KEY", KEY)
    args = parse_args(["--model", str(model_dir), "--host", "0.0.0.0", "--weights-root", "/w"])
    assert args.api_key == KEY and args.weights_root == ["/w"]

    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.delenv("ASYNCRL_ENGINE_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["engine", "serve", "--model", str(model_dir), "--host", "::"])
    assert result.exit_code == 2 and "--api-key" in result.output


def test_launcher_passes_the_key() -> None:
    spec = SGLangLaunchSpec(model_path="m", api_key=KEY, extra_args=["--x"])
    command = build_command(spec)
    assert command[command.index("--api-key") + 1] == KEY and command[-1] == "--x"
    assert KEY not in repr(spec)
    assert "--api-key" not in build_command(SGLangLaunchSpec(model_path="m"))
