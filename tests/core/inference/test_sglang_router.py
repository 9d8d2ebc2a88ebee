"""SGLang's own router (``sglang-router``, a Rust binary from the SGLang project) in front of two
of our servers: SGLang-authored client code speaking its protocol to ours.

The router discovers each worker (``/health``, ``/get_model_info``), then forwards ``/generate``
bodies re-serialised with SGLang's ``GenerateReqInput`` fields (``model``, ``log_metrics``,
``return_hidden_states``, ``background``, ...), which our server must take at their defaults.
Before it did, every request through the router was a 400 "unknown field(s) ['background', ...]".

``sglang-router`` is in the lock file (a Rust wheel and ``setproctitle``, no torch).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import sglang_router  # noqa: F401  (in the lock: a missing router fails here, never skips)

pytestmark = pytest.mark.integration


STARTUP_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def router(servers, model_dir, tmp_path) -> Iterator[tuple[str, list]]:
    """The router on 127.0.0.1 with two of our servers behind it, round robin."""
    workers = [servers.start(model_dir=model_dir, seed=0) for _ in range(2)]
    port = _free_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--worker-urls", *(w.url for w in workers),
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
        "--policy", "round_robin", "--log-level", "warn",
    ]  # fmt: skip
    log = (tmp_path / "router.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_workers(url, 2, process, tmp_path / "router.log")
        yield url, workers
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        log.close()


def _wait_for_workers(url: str, n: int, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"router exited: {log.read_text()[-2000:]}"
        try:
            workers = httpx.get(url + "/workers", timeout=5).json()["workers"]
            if sum(w["is_healthy"] for w in workers) >= n:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"router saw no {n} healthy workers: {log.read_text()[-2000:]}")


def test_sglang_router_drives_our_servers(router) -> None:
    url, workers = router
    prompt = [5, 6, 7] * 3
    greedy = {"temperature": 0, "max_new_tokens": 6}
    with httpx.Client(timeout=60) as http:
        direct = http.post(
            workers[0].url + "/generate", json={"input_ids": prompt, "sampling_params": greedy}
        ).json()
        answers = []
        for _ in range(4):  # round robin: both workers answer
            body = {"input_ids": prompt, "sampling_params": greedy, "return_logprob": True}
            response = http.post(url + "/generate", json=body)
            assert response.status_code == 200, response.text
            answers.append(response.json())
        penalised = {**greedy, "frequency_penalty": 2.0, "ignore_eos": True, "n": 2}
        pair = http.post(
            url + "/generate", json={"input_ids": prompt, "sampling_params": penalised}
        )
        refused = http.post(
            url + "/generate", json={"input_ids": prompt, "sampling_params": {"regex": "a+"}}
        )
    assert all(a["output_ids"] == direct["output_ids"] for a in answers)
    assert all(len(a["meta_info"]["output_token_logprobs"]) == 6 for a in answers)
    assert all(w.engine.stats.requests_served >= 2 for w in workers)
    assert pair.status_code == 200, pair.text
    samples = pair.json()
    assert len(samples) == 2 and samples[0]["output_ids"] == samples[1]["output_ids"]
    assert samples[0]["output_ids"] != direct["output_ids"]
    assert refused.status_code == 400 and "regex" in refused.text
