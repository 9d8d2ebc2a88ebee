"""Start an SGLang server process on a GPU node and wait until it answers ``GET /health``.

SGLang pins its own torch/transformers, so it lives in its own environment: point
``python_executable`` at that environment's interpreter. The server runs in its own process
group so :meth:`LaunchedServer.stop` also ends the scheduler/detokenizer processes it spawns.

``module`` defaults to ``sglang.launch_server``; ``core.inference.server`` accepts the same
flags, which is how the launcher is tested on CPU.

``api_key`` is passed as ``--api-key`` (both servers' flag; note that a command line is visible
to other users of the machine) and sent with the health checks. Binding a non-loopback host
without one is refused by our server.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from core.processes import die_with

logger = logging.getLogger(__name__)


@dataclass
class SGLangLaunchSpec:
    """How to start one server (one node, ``tp_size`` GPUs)."""

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    mem_fraction_static: float = 0.8
    skip_tokenizer_init: bool = True
    dtype: str = "auto"
    python_executable: str = "python"
    module: str = "sglang.launch_server"
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # added to the current environment
    api_key: str | None = field(default=None, repr=False)  # --api-key; None = no key

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def build_command(spec: SGLangLaunchSpec) -> list[str]:
    cmd = [
        spec.python_executable, "-m", spec.module,
        "--model-path", str(spec.model_path),
        "--host", spec.host,
        "--port", str(spec.port),
        "--tp-size", str(spec.tp_size),
        "--mem-fraction-static", str(spec.mem_fraction_static),
    ]  # fmt: skip
    if spec.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    cmd += ["--dtype", spec.dtype]
    if spec.api_key:
        cmd += ["--api-key", spec.api_key]
    return cmd + list(spec.extra_args)


def _log_tail(path: Path, n_lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n_lines:])
    except OSError:
        return "(no log)"


def _healthy(url: str, api_key: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        request = urllib.request.Request(url + "/health", headers=headers)
        with urllib.request.urlopen(request, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


class LaunchedServer:
    """A running server process; a context manager that stops it on exit."""

    def __init__(self, spec: SGLangLaunchSpec, proc: subprocess.Popen, log_path: Path) -> None:
        self.spec = spec
        self.proc = proc
        self.log_path = log_path

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def address(self) -> str:
        return self.spec.address

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n_lines: int = 40) -> str:
        return _log_tail(self.log_path, n_lines)

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the process group; SIGKILL it after ``grace_s``. Returns the exit code."""
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "server pid %d ignored SIGTERM for %.0fs: killing", self.proc.pid, grace_s
                )
                self._signal(signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: the group id is the pid
        except ProcessLookupError:
            pass

    def __enter__(self) -> LaunchedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    spec: SGLangLaunchSpec, log_path: str | Path, die_with_parent: bool = False
) -> LaunchedServer:
    """Start the server process, logging to ``log_path``; do not wait for it (see
    :func:`wait_healthy`), so several servers load their models at once.

    ``die_with_parent``: the server gets SIGTERM when the *thread* that called this ends (Linux's
    parent-death signal), so a run killed with ``kill -9`` does not leave its servers behind.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = build_command(spec)
    logger.info("launching: %s", " ".join(cmd))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **spec.env},
            preexec_fn=die_with(os.getpid()) if die_with_parent else None,
        )  # fmt: skip
    return LaunchedServer(spec, proc, log_path)


def wait_healthy(server: LaunchedServer, timeout_s: float = 600.0, poll_s: float = 0.5) -> None:
    """Return once ``/health`` answers 200.

    Raises ``RuntimeError`` (with the log tail) if the process exits first, ``TimeoutError``
    (after stopping it) if it is not healthy within ``timeout_s``.
    """
    spec = server.spec
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(
                f"server exited with code {server.proc.returncode} before it was healthy; "
                f"log tail ({server.log_path}):\n{server.log_tail()}"
            )
        if _healthy(spec.url, spec.api_key):
            logger.info("server healthy at %s (pid %d)", spec.url, server.proc.pid)
            return
        time.sleep(poll_s)
    server.stop(grace_s=10)
    raise TimeoutError(
        f"server at {spec.url} not healthy after {timeout_s:.0f}s; log tail:\n{server.log_tail()}"
    )


def launch(
    spec: SGLangLaunchSpec,
    log_path: str | Path,
    health_timeout_s: float = 600.0,
    poll_s: float = 0.5,
) -> LaunchedServer:
    """Start the server, logging to ``log_path``; return once ``/health`` answers 200
    (errors as :func:`wait_healthy`'s)."""
    server = start(spec, log_path)
    wait_healthy(server, health_timeout_s, poll_s)
    return server
