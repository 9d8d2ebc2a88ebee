"""Shared fixtures. S3: a real moto server on a free local port, started once per session.
Prefect: one real API server (Prefect's own test harness, on a fresh database) for the session.

Nothing here sets environment variables or other global state: tests that talk to S3 pass
the endpoint and the fake keys explicitly (``s3_storage_options``, ``s3_client``). The one
exception removes what ``asyncrl stack up`` exports: with it in a developer's shell, runs would
go to that stack instead of the stores the tests read back (tests that want it set it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core.processes import environment
from core.training.distributed import free_port

S3_KEY = "testing-key"
S3_SECRET = "testing-secret"
S3_REGION = "us-east-1"
_SERVER_START_TIMEOUT_S = 60.0

for _stack_var in ("MLFLOW_TRACKING_URI", "ASYNCRL_FILEROOT", "PREFECT_API_URL"):
    os.environ.pop(_stack_var, None)


def _wait_until_up(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + _SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}: {log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means the server is up
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer on {url} within {_SERVER_START_TIMEOUT_S}s")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a moto S3 server (``http://127.0.0.1:<port>``), stopped at session end."""
    moto = Path(sys.executable).parent / "moto_server"
    if not moto.exists():
        raise RuntimeError(
            f"moto_server not installed next to {sys.executable}: run infra/setup_env.sh"
        )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        _wait_until_up(url, proc, log_path)
        yield url
    finally:
        # Stop exactly the process started here.
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Any:
    """A boto3 S3 client for the moto server (explicit fake keys, no environment)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
        region_name=S3_REGION,
    )


@pytest.fixture(scope="session")
def make_s3_bucket(s3_client: Any) -> Callable[..., str]:
    """Factory: ``make_s3_bucket()`` creates a uniquely named bucket and returns its name."""

    def create(name: str | None = None) -> str:
        bucket = name or f"test-{uuid.uuid4().hex[:12]}"
        s3_client.create_bucket(Bucket=bucket)
        return bucket

    return create


@pytest.fixture
def s3_bucket(make_s3_bucket: Callable[..., str]) -> str:
    """A fresh, empty bucket for one test."""
    return make_s3_bucket()


@pytest.fixture
def s3_storage_options(s3_endpoint: str) -> dict[str, Any]:
    """fsspec/s3fs ``storage_options`` for the moto server; a new dict per test."""
    return {
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": S3_REGION},
        "key": S3_KEY,
        "secret": S3_SECRET,
    }


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prefect's test harness for the session (a real, temporary API server and database);
    yields its API URL. Flows called in this process use it from the first test that asks for
    it on; a CLI run in a subprocess uses it through :func:`prefect_env` instead of starting a
    temporary server of its own (that start-up takes ~13 s on this box)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    with environment({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}):
        with prefect_test_harness(server_startup_timeout=120):
            yield str(PREFECT_API_URL.value())


@pytest.fixture
def prefect_env(harness: str) -> dict[str, str]:
    """Environment for an ``asyncrl`` subprocess that records its flow runs on the harness."""
    return {**os.environ, "PREFECT_API_URL": harness}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests (tests/gpu, run by infra/gpu_check.sh) skip without a CUDA device; they are
    the only tests that may skip for want of hardware."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run infra/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
