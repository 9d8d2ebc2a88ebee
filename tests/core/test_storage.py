"""Storage calls never hang: an object store that accepts connections and never answers gives a
clear error after bounded, logged retries; errors about the object itself are not retried."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.storage import read_text, storage_retry, write_text


@dataclass
class SilentEndpoint:
    url: str
    held: list[socket.socket]  # every connection accepted so far


@pytest.fixture
def silent_endpoint() -> Iterator[SilentEndpoint]:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield SilentEndpoint(f"http://127.0.0.1:{server.getsockname()[1]}", held)
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def _against(endpoint: SilentEndpoint, script: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``script`` with s3:// pointed at ``endpoint`` and short storage timeouts."""
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint.url,
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
        "ASYNCRL_STORAGE_CONNECT_TIMEOUT_S": "0.5",
        "ASYNCRL_STORAGE_READ_TIMEOUT_S": "0.5",
        "ASYNCRL_STORAGE_ATTEMPTS": "3",
    }
    prelude = "import logging; logging.basicConfig(level=logging.WARNING)\n"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", prelude + script],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done, time.monotonic() - started


@pytest.mark.integration
def test_a_silent_object_store_fails_with_logged_retries(silent_endpoint: SilentEndpoint) -> None:
    done, elapsed = _against(
        silent_endpoint, "from core.storage import read_text\nread_text('s3://bucket/run/x.json')"
    )
    assert done.returncode != 0
    # two retries logged (3 attempts), then the timeout naming the URL
    assert done.stderr.count("Retrying core.storage.read_text") == 2, done.stderr[-2000:]
    assert "storage unreachable: read_text('s3://bucket/run/x.json') failed 3 times" in done.stderr
    assert "Read timeout on endpoint URL" in done.stderr
    # s3fs's own silent tries are off: an attempt sends its requests once (s3fs's HEAD, then a
    # listing when that fails), each on one connection; 61 were opened with s3fs's five tries
    assert len(silent_endpoint.held) <= 2 * 3
    assert elapsed < 30


@pytest.mark.integration
def test_the_run_lock_on_a_silent_object_store_fails_with_logged_retries(
    silent_endpoint: SilentEndpoint,
) -> None:
    """Taking the run folder's lock was the silent 15-minute hang: it now goes through the same
    bounded retries as every storage call and fails naming the lock's URL."""
    done, elapsed = _against(
        silent_endpoint,
        "from core.runtime.run_lock import RunLock\nRunLock('s3://bucket/runs/a').acquire()",
    )
    assert done.returncode != 0
    assert done.stderr.count("Retrying core.storage.") == 2, done.stderr[-2000:]
    assert "storage unreachable: read_text('s3://bucket/runs/a/LOCK') failed 3 times" in done.stderr
    assert len(silent_endpoint.held) <= 6  # one connection per request sent
    assert elapsed < 30


def test_errors_about_the_object_are_not_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="core.storage"):
        with pytest.raises(FileNotFoundError):
            read_text(str(tmp_path / "absent.txt"))
    assert time.monotonic() - started < 0.5 and not caplog.records


def test_transient_errors_are_retried_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    @storage_retry
    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")
        return "ok"

    with caplog.at_level(logging.WARNING, logger="core.storage"):
        assert flaky() == "ok"
    assert len(calls) == 3
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "Retrying tests.core.test_storage.test_transient_errors_are_retried_with_a_log_line."
        "<locals>.flaky"
    ] * 2


def test_a_failed_local_write_leaves_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_text replaces a local file whole or not at all: a write that fails before it is
    complete (here the final rename) keeps the old content and leaves no partial file."""
    target = tmp_path / "run" / "summary.json"
    write_text(str(target), '{"steps": 10}\n')  # creates the folder too
    write_text(str(target), '{"steps": 20}\n')
    assert read_text(str(target)) == '{"steps": 20}\n'
    fresh = tmp_path / "plain.txt"
    fresh.write_text("x")
    assert target.stat().st_mode == fresh.stat().st_mode  # an ordinary file, not a 0600 temp

    def no_space(src: object, dst: object) -> None:
        raise PermissionError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(PermissionError):
        write_text(str(target), '{"steps": 30, "truncated":')
    assert read_text(str(target)) == '{"steps": 20}\n'
    assert [p.name for p in target.parent.iterdir()] == ["summary.json"]
