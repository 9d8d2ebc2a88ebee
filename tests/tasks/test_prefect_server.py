"""Prefect's temporary API server as the CLI starts it (tasks/prefect_server.py): Prefect's client
uses it, a signal to the job's process group does not reach it, and it dies with its owner even
when the owner is killed with SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

OWNER = """
import os, time
from prefect.client.orchestration import get_client
from prefect.server.api.server import SubprocessASGIServer
from tasks.prefect_server import temporary_prefect_server

with temporary_prefect_server() as url:
    client_url = str(get_client(sync_client=True).api_url).rstrip("/")
    server = SubprocessASGIServer._instances[None].server_process
    print(url, client_url, server.pid, flush=True)
    time.sleep(600)
"""


def test_the_server_is_prefects_own_outside_the_job_group_and_dies_with_its_owner(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        cwd=ROOT,
        env={**env, "PREFECT_HOME": str(tmp_path / "prefect")},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    server: psutil.Process | None = None
    try:
        url, client_url, pid = owner.stdout.readline().split()  # type: ignore[union-attr]
        server = psutil.Process(int(pid))
        assert url == client_url and url.startswith("http://127.0.0.1:")
        assert server.ppid() == owner.pid
        # a signal to the job's process group (Slurm, Ctrl-C) does not reach the server
        assert os.getpgid(server.pid) == server.pid != os.getpgid(owner.pid)
        owner.kill()  # SIGKILL: no cleanup runs in the owner
        owner.wait(timeout=10)
        server.wait(timeout=20)  # the parent-death signal stopped it
    finally:
        if server is not None and server.is_running():
            server.kill()
        if owner.poll() is None:
            owner.kill()
            owner.wait()


STARTER = """
import logging
logging.basicConfig(level=logging.WARNING)
from tasks.prefect_server import temporary_prefect_server

with temporary_prefect_server() as url:
    print("up", url, flush=True)
"""


def test_jobs_started_at_once_on_a_fresh_home_start_without_a_traceback(tmp_path: Path) -> None:
    """Three temporary servers on one new PREFECT_HOME: their database migrations take turns,
    so none logs alembic's CommandError (one of three did before the start-up lock)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for _ in range(3)
    ]
    outputs = [job.communicate(timeout=240) for job in jobs]
    for job, (out, err) in zip(jobs, outputs, strict=True):
        assert job.returncode == 0 and out.startswith("up http://127.0.0.1:"), err[-2000:]
        assert "Traceback" not in err and "CommandError" not in err, err[-2000:]
