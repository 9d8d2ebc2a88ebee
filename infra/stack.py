"""The local service stack behind ``asyncrl stack up|down|status``: S3, Prefect, MLflow on 127.0.0.1.

``stack_up`` starts three detached processes (own session, so they outlive the CLI and can be
stopped as process groups), records them in ``{state_dir}/stack.json`` and waits for health:

* ``s3``      — ``moto_server``: an in-memory S3 endpoint (contents are lost when it stops), with
  the bucket created at start. Run files go to ``s3://{bucket}/runs`` (``ASYNCRL_FILEROOT``: a
  config that leaves ``cluster.fileroot`` at its default takes it).
* ``prefect`` — ``prefect server start``; its sqlite DB lives in ``{state_dir}/prefect``.
* ``mlflow``  — ``mlflow server`` with a sqlite store in ``{state_dir}/mlflow`` and artifacts proxied
  to ``s3://{bucket}/mlartifacts`` (clients need no S3 access for them). The job runner is off
  (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``): ~440 MB instead of ~2.8 GB.

Logs go to ``{state_dir}/logs/<service>.log``. ``StackInfo.env()`` is the environment to export
(runs honour ``MLFLOW_TRACKING_URI`` and ``ASYNCRL_FILEROOT`` unless their config names others);
``StackInfo.urls()`` the addresses to open: the Prefect UI, the MLflow UI, the S3 endpoint.

Real deployments swap pieces, keeping the same environment variables:

* S3: MinIO (``minio server``, set ``AWS_ENDPOINT_URL``/``MLFLOW_S3_ENDPOINT_URL`` to it) or AWS
  S3 itself (unset both endpoints; credentials from an IAM role or profile, never from configs).
* Backends: Postgres for MLflow (``--backend-store-uri postgresql://...``) and Prefect
  (``PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://...``); sqlite is single-machine.
* Ray: join an existing cluster with ``cluster.ray_address=ray://head:10001`` (or ``auto``)
  instead of a local Ray started per run.
* Prefect execution: a work pool + ``prefect worker start --pool ...`` (deployments via
  ``flow.deploy``) instead of ``flow.serve`` in a long-lived process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
STATE_FILE = "stack.json"
# Fake credentials: moto accepts any; they only have to be present for boto3/s3fs.
FAKE_KEY_ID = "asyncrl-local"
FAKE_SECRET = "asyncrl-local-secret"
REGION = "us-east-1"
SERVICES = ("s3", "prefect", "mlflow")
HEALTH_PATHS = {"s3": "/moto-api/", "prefect": "/api/health", "mlflow": "/health"}


class StackError(RuntimeError):
    """The stack could not be started (the message says why, with the log tail)."""


@dataclass
class Service:
    name: str
    pid: int
    port: int
    url: str
    log: str
    argv: list[str]


@dataclass
class StackInfo:
    state_dir: str
    bucket: str
    started_at: float
    services: dict[str, Service] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """Environment for clients of this stack (``export`` it, or pass it to subprocesses)."""
        s3 = self.services["s3"].url
        return {
            "PREFECT_API_URL": f"{self.services['prefect'].url}/api",
            "MLFLOW_TRACKING_URI": self.services["mlflow"].url,
            "AWS_ENDPOINT_URL": s3,
            "MLFLOW_S3_ENDPOINT_URL": s3,
            "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "ASYNCRL_FILEROOT": f"s3://{self.bucket}/runs",
        }

    def urls(self) -> dict[str, str]:
        """What a person opens: the Prefect UI, the MLflow UI, and the S3 endpoint."""
        return {
            "Prefect UI": self.services["prefect"].url,
            "MLflow UI": self.services["mlflow"].url,
            "S3 endpoint": self.services["s3"].url,
        }

    def save(self) -> None:
        path = Path(self.state_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)  # atomic: a concurrent `status` never reads half a file

    @classmethod
    def load(cls, state_dir: Path) -> StackInfo | None:
        path = Path(state_dir) / STATE_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        services = {name: Service(**svc) for name, svc in data.pop("services").items()}
        return cls(**data, services=services)


# ------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------


def _executable(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise StackError(
            f"{name} is not installed next to {sys.executable} (run infra/setup_env.sh)"
        )
    return str(path)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the servers themselves: TIME_WAIT leftovers do not block, a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our own child (a stack started in this process), else no-op."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _group_alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_child(pid: int) -> bool:
    """``pid`` is a child of this process (an unreaped child's PID cannot have been reused)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def _owns(service: Service) -> bool:
    """The recorded PID still runs what we started (guards against PID reuse after a reboot)."""
    if not _group_alive(service.pid):
        return False
    if _is_child(service.pid):
        # Started by this process: ours, even in the instant between fork and exec when its
        # command line is still ours (a stack that fails while another service starts).
        return True
    cmdline = Path(f"/proc/{service.pid}/cmdline")
    if not cmdline.exists():  # not Linux, or the leader exited while the group lives on
        return True
    argv = cmdline.read_bytes().decode(errors="replace").split("\0")
    return any(Path(service.argv[0]).name in arg for arg in argv[:3])


def _tail(path: str | Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _healthy(name: str, url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url + HEALTH_PATHS[name], timeout=timeout) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return name == "s3"  # moto: any HTTP answer means it is serving
    except OSError:
        return False


def _spawn(name: str, argv: list[str], port: int, env: dict[str, str], logs: Path) -> Service:
    log_path = logs / f"{name}.log"
    with log_path.open("ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip
    logger.info("started %s (pid %d) on port %d, log %s", name, proc.pid, port, log_path)
    return Service(name, proc.pid, port, f"http://{HOST}:{port}", str(log_path), argv)


def _wait_healthy(services: list[Service], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = {s.name: s for s in services}
    while pending:
        for name, service in list(pending.items()):
            if not _group_alive(service.pid):
                raise StackError(
                    f"{name} exited during start-up; log {service.log}:\n{_tail(service.log)}"
                )
            if _healthy(name, service.url):
                logger.info("%s healthy at %s", name, service.url)
                del pending[name]
        if pending and time.monotonic() > deadline:
            details = "\n".join(
                f"--- {s.name} ({s.log}):\n{_tail(s.log)}" for s in pending.values()
            )
            raise StackError(
                f"not healthy within {timeout_s:.0f}s: {', '.join(pending)}\n{details}"
            )
        if pending:
            time.sleep(0.5)


def _create_bucket(endpoint: str, bucket: str) -> None:
    import boto3  # heavy import, only needed here

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=FAKE_KEY_ID,
                          aws_secret_access_key=FAKE_SECRET, region_name=REGION)  # fmt: skip
    client.create_bucket(Bucket=bucket)


def _terminate(services: list[Service], grace_s: float = 15.0) -> None:
    """SIGTERM each process group, wait, then SIGKILL what is left."""
    targets = [s for s in services if _owns(s)]
    for service in targets:
        try:
            os.killpg(service.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while any(_group_alive(s.pid) for s in targets) and time.monotonic() < deadline:
        time.sleep(0.2)
    for service in targets:
        if _group_alive(service.pid):
            logger.warning("%s (pid %d) ignored SIGTERM: killing it", service.name, service.pid)
            try:
                os.killpg(service.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while any(_group_alive(s.pid) for s in targets) and time.monotonic() < deadline:
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def local_s3(
    log_dir: Path, bucket: str, port: int, timeout_s: float = 60.0
) -> Iterator[dict[str, str]]:
    """Just the stack's S3: a ``moto_server`` on ``port`` with ``bucket`` created, stopped when
    the block ends. Yields the environment its clients need (endpoint, fake keys)."""
    service = _spawn("s3", [_executable("moto_server"), "-H", HOST, "-p", str(port)], port,
                     dict(os.environ), log_dir)  # fmt: skip
    try:
        _wait_healthy([service], timeout_s)
        _create_bucket(service.url, bucket)
        yield {
            "AWS_ENDPOINT_URL": service.url,
            "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
            "AWS_DEFAULT_REGION": REGION,
        }
    finally:
        _terminate([service])


def stack_up(
    state_dir: Path,
    *,
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
    s3_port: int = 9000,
    bucket: str = "asyncrl",
    timeout_s: float = 120.0,
) -> StackInfo:
    """Start S3 (moto), Prefect and MLflow on 127.0.0.1; raise :class:`StackError` on failure
    (a stack already running from ``state_dir``, a port taken, a service not healthy in time),
    stopping whatever it started."""
    state_dir = Path(state_dir).resolve()
    existing = StackInfo.load(state_dir)
    if existing is not None:
        alive = [s.name for s in existing.services.values() if _owns(s)]
        if alive:
            raise StackError(f"a stack is already running from {state_dir} ({', '.join(alive)}); "
                             "stop it first with `asyncrl stack down`")  # fmt: skip
        logger.info("removing the stale record of a stopped stack in %s", state_dir)
        (state_dir / STATE_FILE).unlink()
    ports = {"s3": s3_port, "prefect": prefect_port, "mlflow": mlflow_port}
    if len(set(ports.values())) != len(ports):
        raise StackError(f"ports must differ: {ports}")
    taken = [f"{name} port {port}" for name, port in ports.items() if not _port_free(port)]
    if taken:
        raise StackError(f"already in use on {HOST}: {', '.join(taken)} (choose other ports)")
    argv = {
        "s3": [_executable("moto_server"), "-H", HOST, "-p", str(s3_port)],
        "prefect": [_executable("prefect"), "server", "start", "--host", HOST, "--port", str(prefect_port)],
        "mlflow": [_executable("mlflow"), "server", "--host", HOST, "--port", str(mlflow_port),
                   "--workers", "1", "--backend-store-uri", f"sqlite:///{state_dir}/mlflow/mlflow.db",
                   "--artifacts-destination", f"s3://{bucket}/mlartifacts"],
    }  # fmt: skip
    logs = state_dir / "logs"
    for folder in (logs, state_dir / "prefect", state_dir / "mlflow"):
        folder.mkdir(parents=True, exist_ok=True)
    s3_url = f"http://{HOST}:{s3_port}"
    base_env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # Clients' settings in our own env must not leak into the servers (e.g. a PREFECT_API_URL
    # pointing at another server, or real AWS credentials next to the fake endpoint).
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        base_env.pop(key, None)
    envs = {
        "s3": base_env,
        # The UI's API address is its own setting (default port 4200): on another port the UI
        # would call a server that is not there.
        "prefect": {**base_env, "PREFECT_HOME": str(state_dir / "prefect"),
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_UI_API_URL": f"http://{HOST}:{prefect_port}/api"},
        "mlflow": {**base_env, "MLFLOW_S3_ENDPOINT_URL": s3_url, "AWS_ENDPOINT_URL": s3_url,
                   "AWS_ACCESS_KEY_ID": FAKE_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
                   "AWS_DEFAULT_REGION": REGION, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    }  # fmt: skip
    info = StackInfo(state_dir=str(state_dir), bucket=bucket, started_at=time.time())
    try:
        # S3 first: MLflow's artifact proxy needs the bucket. Prefect and MLflow then start
        # side by side (each takes ~7-12 s, mostly imports and migrations).
        info.services["s3"] = _spawn("s3", argv["s3"], s3_port, envs["s3"], logs)
        info.save()  # recorded at once, so `stack down` can stop a half-started stack
        _wait_healthy([info.services["s3"]], timeout_s)
        _create_bucket(s3_url, bucket)
        for name in ("prefect", "mlflow"):
            info.services[name] = _spawn(name, argv[name], ports[name], envs[name], logs)
        info.save()
        _wait_healthy([info.services["prefect"], info.services["mlflow"]], timeout_s)
    except BaseException:
        _terminate(list(info.services.values()))
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        raise
    logger.info("stack up: %s", {n: s.url for n, s in info.services.items()})
    return info


def stack_down(state_dir: Path) -> None:
    """Stop every recorded process group (SIGTERM, then SIGKILL) and forget the stack.
    Idempotent: nothing recorded, nothing to do."""
    info = StackInfo.load(Path(state_dir))
    if info is None:
        logger.info("no stack recorded in %s", state_dir)
        return
    _terminate(list(info.services.values()))
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    logger.info("stack in %s stopped", state_dir)


def stack_status(state_dir: Path) -> dict[str, Any]:
    """``{"running": bool, "state_dir", "services": {name: {pid, alive, url, healthy, log}}}``."""
    info = StackInfo.load(Path(state_dir))
    if info is None:
        return {"running": False, "state_dir": str(state_dir), "services": {}}
    services = {}
    for name, service in info.services.items():
        alive = _owns(service)
        services[name] = {"pid": service.pid, "alive": alive, "url": service.url,
                          "healthy": alive and _healthy(name, service.url), "log": service.log}  # fmt: skip
    running = bool(services) and all(s["alive"] for s in services.values())
    return {"running": running, "state_dir": info.state_dir, "services": services}
