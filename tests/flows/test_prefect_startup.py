"""Prefect's temporary API server on a busy machine: it starts, or the CLI says what to do.

Prefect gives its temporary server 20 s by default; on this project's 2-core CI box that ran out
once while another job was installing packages, failing a user's first `asyncrl run`. Importing
our flows raises the wait (tasks/__init__.py); here a fresh Prefect database (the slowest
start, with migrations) comes up while both cores are kept busy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
TIMEOUT_VAR = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


@pytest.fixture
def busy_cpus() -> Iterator[None]:
    """Two processes spinning at 100 % (one per core of the CI box), stopped by PID."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait(timeout=10)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", TIMEOUT_VAR)}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), **extra}


FLOW = """
import flows, os
from prefect import flow

@flow
def probe() -> int:
    return 42

print("wait", os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"], "result", probe())
"""


def test_temporary_server_starts_on_a_fresh_database_under_cpu_load(
    tmp_path: Path, busy_cpus: None
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FLOW],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wait 180 result 42" in proc.stdout


def test_cli_names_the_setting_when_the_server_cannot_start(tmp_path: Path) -> None:
    # A wait of one second cannot fit a fresh database's start-up on any machine.
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "asyncrl"), "run", QUICKSTART,
         f"cluster.fileroot={tmp_path / 'runs'}", "sft.enabled=false", "learner.total_steps=0"],
        cwd=ROOT,
        env=_env(tmp_path, **{TIMEOUT_VAR: "1", "COLUMNS": "200"}),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    message = " ".join(proc.stderr.split())
    assert f"did not start within 1 s ({TIMEOUT_VAR})" in message
    assert "asyncrl run --plain" in message and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # it failed before any stage ran
