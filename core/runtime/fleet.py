"""The run's own inference servers: ``inference.n_servers`` processes speaking SGLang's HTTP API.

With ``inference.engine=sglang`` and no ``inference.server_addresses``, the run launches its servers
from its starting weights (after SFT, or the resumed checkpoint's) *at* its starting version, so
the first rollout needs no weight load. Each server may read the run's published weights
(``--weights-root``), binds 127.0.0.1, and is started with a parent-death signal: a run that
ends by any path, ``kill -9`` included, does not leave a server behind.

``inference.server_launcher`` picks the server: ours (``python -m core.inference.server``, the
same protocol on CPU or CUDA) or SGLang's (``python -m sglang.launch_server`` run by
``inference.server_python``, its own environment).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.config import Config
from core.inference.clients.http_client import API_KEY_ENV
from core.inference.clients.sglang_launcher import (
    LaunchedServer,
    SGLangLaunchSpec,
    start,
    wait_healthy,
)
from core.inference.server.guard import is_loopback
from core.runtime.placement import RESOURCE_SLIVER, ensure_ray
from core.storage import fetch_dir

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 600.0
_MODULES = {"asyncrl": "core.inference.server", "sglang": "sglang.launch_server"}


def launches_servers(config: Config) -> bool:
    """Whether this run launches its own inference servers."""
    return config.inference.engine == "sglang" and not config.inference.server_addresses


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the server binds it moments later)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_spec(
    config: Config,
    model_dir: str,
    version: int,
    weights_roots: list[str],
    port: int,
    host: str = "127.0.0.1",
) -> SGLangLaunchSpec:
    """How to start one of the run's servers on ``host:port``."""
    r = config.inference
    extra = ["--weight-version", str(version), "--random-seed", str(config.experiment.seed)]
    extra += ["--max-running-requests", str(r.max_batch_rows or config.rollout.max_concurrent)]
    if r.max_batch_rows:  # the oldest groups' calls first (the rollout sends their order)
        extra += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
    if r.server_launcher == "asyncrl":
        for root in weights_roots:
            extra += ["--weights-root", root]
        extra += ["--torch-threads", str(config.scheduler.torch_threads)]
        extra += ["--prefix-cache-tokens", str(r.prefix_cache_tokens)]
        extra += ["--kv-after-update", r.kv_after_update]
    return SGLangLaunchSpec(
        model_path=model_dir,
        host=host,
        port=port,
        api_key=os.environ.get(API_KEY_ENV) or None,
        dtype=config.model.dtype,
        python_executable=r.server_python or sys.executable,
        module=_MODULES[r.server_launcher],
        extra_args=extra,
    )


class ServerHost:
    """A Ray actor that runs one of the run's servers on the node Ray placed it on.

    The server binds the node's address; beyond loopback our server needs an API key, which
    every node must have in ``$ASYNCRL_ENGINE_API_KEY`` (the run's clients send the same).
    """

    def __init__(
        self, config: Config, model_source: str, version: int, weights_roots: list[str],
        log_dir: str, health_timeout_s: float,
    ) -> None:  # fmt: skip
        import ray

        host = ray.util.get_node_ip_address()
        if not is_loopback(host) and not os.environ.get(API_KEY_ENV):
            raise RuntimeError(
                f"an inference server on node {host} binds that address and needs an API key: "
                f"set {API_KEY_ENV} on every node (ray start inherits it)"
            )
        self.node_id = ray.get_runtime_context().get_node_id()
        spec = server_spec(
            config, fetch_dir(model_source), version, weights_roots, free_port(host), host
        )
        self.server = start(spec, Path(log_dir) / f"server-{spec.port}.log", die_with_parent=True)
        wait_healthy(self.server, health_timeout_s)

    def describe(self) -> dict[str, str]:
        return {"address": self.server.address, "node_id": self.node_id}

    def alive(self) -> bool:
        return self.server.alive()

    def restart(self, model_source: str, version: int, health_timeout_s: float) -> None:
        """Start the server again on its address, from ``model_source`` at ``version``."""
        self.server = relaunch(self.server, fetch_dir(model_source), version, health_timeout_s)

    def close(self) -> None:
        self.server.stop(grace_s=15)


@dataclass
class ServerFleet:
    """Running servers (local processes, or :class:`ServerHost` Ray actors); :meth:`stop` ends
    them all (a context manager does it on exit)."""

    servers: list[LaunchedServer]
    hosts: list[Any] = field(default_factory=list)  # Ray actor handles of ServerHost
    placement: list[dict[str, str]] = field(default_factory=list)  # address and node of each

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers] or [p["address"] for p in self.placement]

    def dead(self) -> list[int]:
        """Indices of the servers whose process has exited."""
        if self.hosts:
            import ray

            alive = []
            for host in self.hosts:
                try:
                    alive.append(ray.get(host.alive.remote(), timeout=30))
                except Exception:  # the actor itself is gone: cannot be restarted in place
                    raise RuntimeError("an inference server's Ray actor died") from None
            return [i for i, ok in enumerate(alive) if not ok]
        return [i for i, server in enumerate(self.servers) if not server.alive()]

    def restart(self, indices: list[int], model_source: str, version: int) -> list[str]:
        """Start these servers again on their addresses, from ``model_source`` at ``version``;
        returns their addresses."""
        for i in indices:
            if self.hosts:
                import ray

                ray.get(self.hosts[i].restart.remote(model_source, version, HEALTH_TIMEOUT_S))
            else:
                self.servers[i] = relaunch(self.servers[i], fetch_dir(model_source), version)
        return [self.addresses[i] for i in indices]

    def stop(self) -> None:
        for server in self.servers:
            server.stop(grace_s=15)
        if self.hosts:
            import ray

            for host in self.hosts:
                try:
                    ray.get(host.close.remote(), timeout=30)
                except Exception as err:  # gone already; killing the actor is what matters
                    logger.debug("server host close(): %r", err)
                ray.kill(host)

    def __enter__(self) -> ServerFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def relaunch(
    server: LaunchedServer, model_dir: str, version: int, health_timeout_s: float = 600.0
) -> LaunchedServer:
    """A server that exited, started again with the same flags and address from ``model_dir``
    at ``version``; its log continues in the same file."""
    extra = list(server.spec.extra_args)
    at = extra.index("--weight-version")
    extra[at + 1] = str(version)
    spec = replace(server.spec, model_path=model_dir, extra_args=extra)
    logger.warning("restarting the inference server at %s at version %d", spec.address, version)
    restarted = start(spec, server.log_path, die_with_parent=True)
    wait_healthy(restarted, health_timeout_s)
    return restarted


def launch_fleet(
    config: Config,
    model_dir: str,
    version: int,
    *,
    weights_roots: list[Path | str | None],
    log_dir: Path,
    health_timeout_s: float = 600.0,
) -> ServerFleet:
    """Start ``inference.n_servers`` servers serving ``model_dir`` (a folder or URL) as ``version``; return once all
    answer ``/health`` (they load their models at the same time). ``weights_roots``: the local
    folders and URLs weight updates may come from (None entries skipped). A server that fails to
    start stops the others and raises with its log's tail."""
    roots = [str(root) for root in weights_roots if root is not None]
    if config.scheduler.type == "ray":
        return _launch_on_ray(config, model_dir, version, roots, log_dir, health_timeout_s)
    local_dir = fetch_dir(model_dir)  # a server starts from a local folder
    servers: list[LaunchedServer] = []
    try:
        for i in range(config.inference.n_servers):
            spec = server_spec(config, local_dir, version, roots, free_port())
            servers.append(start(spec, log_dir / f"server-{i}.log", die_with_parent=True))
        for server in servers:
            wait_healthy(server, health_timeout_s)
    except BaseException:
        ServerFleet(servers).stop()
        raise
    logger.info(
        "launched %d inference server(s) at version %d: %s", len(servers), version,
        ", ".join(s.address for s in servers),
    )  # fmt: skip
    return ServerFleet(servers)


def _launch_on_ray(
    config: Config, model_source: str, version: int, roots: list[str], log_dir: Path,
    health_timeout_s: float,
) -> ServerFleet:  # fmt: skip
    """``inference.n_servers`` :class:`ServerHost` actors, placed by resources (across nodes)."""
    import ray

    ensure_ray(config)
    s = config.scheduler
    options: dict[str, Any] = {
        "num_cpus": s.server_cpus,
        "num_gpus": 1.0 if config.cluster.n_gpus_per_node else 0.0,
    }
    if s.server_resource:
        options["resources"] = {s.server_resource: RESOURCE_SLIVER}
    remote = ray.remote(ServerHost).options(**options)
    hosts = [
        remote.remote(config, model_source, version, roots, str(log_dir), health_timeout_s)
        for _ in range(config.inference.n_servers)
    ]
    fleet = ServerFleet([], hosts)
    try:
        fleet.placement = ray.get([h.describe.remote() for h in hosts], timeout=health_timeout_s)
    except BaseException:
        fleet.stop()
        raise
    logger.info("launched %d inference server(s) on Ray: %s", len(hosts), fleet.placement)
    return fleet


def with_servers(config: Config, addresses: list[str]) -> Config:
    """``config`` whose rollout reaches ``addresses``."""
    return replace(config, inference=replace(config.inference, server_addresses=list(addresses)))
