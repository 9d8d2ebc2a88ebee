"""Prefect's temporary API server, kept up until Prefect has recorded how the run ended.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server (uvicorn) on first use, as a
child in the job's process group, and stops it at interpreter exit. A SIGTERM or Ctrl-C sent to
the whole group (Slurm, a terminal, ``kill -TERM -PGID``) then stopped the server at once, and
the main process spent minutes in client retries marking the flow run crashed against a server
that was gone. :func:`temporary_prefect_server` starts that same server in a session of its own,
so only this process stops it, after the flow call has unwound (Prefect has set the run's final
state) and its log and event queues are drained. On Linux the server gets SIGTERM when the
process that started it dies, even by ``kill -9``, so it never outlives the job.

Each temporary server migrates the database under ``PREFECT_HOME`` as it starts. Jobs started
at once on a fresh home raced in that migration (alembic's "expected to match one row" traceback,
then a recovery an operator takes for a failure), so start-ups on one home take turns: a file
lock in that folder is held until the server answers, by when its migration is done.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect.server.api.server import SubprocessASGIServer

from core.processes import die_with

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 5.0  # Prefect's queued logs and events, sent before the server stops


class _OwnSessionServer(SubprocessASGIServer):
    """Prefect's temporary server, started outside the job's process group."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        # Prefect 3.9's command and environment, plus the new session and the parent-death signal.
        import prefect
        from prefect.settings import get_current_settings

        server_env = {
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        settings = get_current_settings().to_environment_variables(exclude_unset=True)
        return subprocess.Popen(
            [sys.executable, "-m", "uvicorn",
             "--app-dir", str(prefect.__module_path__.parent),
             "--factory", "prefect.server.api.server:create_app",
             "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"],
            env={**os.environ, **server_env, **settings},
            start_new_session=True,
            preexec_fn=die_with(os.getpid()),
        )  # fmt: skip


@contextmanager
def temporary_prefect_server() -> Iterator[str | None]:
    """Run the block with Prefect's temporary API server, stopped when the block ends.

    Yields its API URL; ``None`` when there is nothing to start: ``PREFECT_API_URL`` names a
    server, the temporary one is disabled, or one already runs in this process (a test
    harness). Prefect's own calls find this server, as they find the one it would start.
    Enter it on the main thread: Linux sends the parent-death signal when the thread that
    started the server ends.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    running = SubprocessASGIServer._instances.get(None)
    if (
        PREFECT_API_URL.value()
        or not PREFECT_SERVER_EPHEMERAL_ENABLED.value()
        or (running is not None and running.running)
    ):
        yield None
        return
    SubprocessASGIServer._instances.pop(None, None)  # a stopped one: replaced by ours
    server = _OwnSessionServer()  # registered under port None, where Prefect looks for it
    try:
        with _start_turn():
            server.start()
        yield server.api_url
    finally:
        if server.running:
            _drain_prefect_queues()
        server.stop()


@contextmanager
def _start_turn() -> Iterator[None]:
    """Hold ``PREFECT_HOME``'s start-up lock: one temporary server migrates its database at a
    time (the lock is the kernel's, released if this process dies)."""
    from prefect.settings import get_current_settings

    home = Path(get_current_settings().home)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".asyncrl-server-start.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _drain_prefect_queues() -> None:
    """Send what Prefect still holds for the API (run logs, events), waiting at most a little."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        _, pending = worker.drain_all(timeout=DRAIN_TIMEOUT_S)  # type: ignore[misc]
        if pending:
            logger.warning("Prefect's %s did not drain in %.0f s", worker.__name__, DRAIN_TIMEOUT_S)
