"""Where the rollout worker and the learner ranks run: Ray actors or local processes.

``scheduler.type=ray`` places them as Ray actors with the configured CPU/GPU resources
(``cluster.ray_address`` joins an existing cluster; otherwise a local Ray starts);
``scheduler.type=local`` starts plain subprocesses (one learner rank runs in the driver itself).
Either way the rollout side is a separate process from the learner, so they run concurrently.
The driver gets typed handles on them (:mod:`core.runtime.handles`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from core.config import Config
from core.runtime.actors import Actor, InProcessActor, ProcessActor, RayActor
from core.runtime.handles import LearnerHandle, LearnerRank, RolloutHandle, typed
from core.runtime.learner_worker import LearnerWorker
from core.runtime.rollout_worker import RolloutWorker
from core.runtime.watchdog import learner_watch, rollout_watch
from core.training.distributed import free_port

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# What a worker node imports of this checkout, shipped by Ray's runtime_env: a node needs only
# the Python environment.
PROJECT_MODULES = ("core", "tasks", "flows", "experiments")
RESOURCE_SLIVER = 0.001  # of a node's custom resource: a placement label, not a quantity


def ensure_ray(config: Config) -> None:
    """Connect to ``cluster.ray_address`` or start a local Ray sized for this run."""
    import ray

    if ray.is_initialized():
        return
    with _keep_sigterm_handler():
        if config.cluster.ray_address:  # a running cluster: our code travels with the job
            ray.init(
                address=config.cluster.ray_address,
                log_to_driver=False,
                runtime_env={"py_modules": [str(PROJECT_ROOT / m) for m in PROJECT_MODULES]},
            )
            return
        cpus = config.scheduler.rollout_cpus + config.scheduler.learner_cpus
        ray.init(
            num_cpus=max(1, int(round(cpus))),
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={
                "env_vars": {
                    "PYTHONPATH": os.pathsep.join(
                        filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])
                    )
                }
            },
        )


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """``ray.init`` installs a native SIGTERM handler in the driver that aborts it (exit -6,
    no cleanup); put back the handler that was there (the CLI's, which unwinds the job)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def start_rollout(
    config: Config,
    model_dir: str,
    train: list[dict],
    *,
    version: int = 0,
    state: dict[str, Any] | None = None,
    weights_url: str | None = None,
) -> RolloutHandle:
    """The rollout worker (engine + executor) in its own process (``weights_url``: see
    :class:`~core.runtime.rollout_worker.RolloutWorker`)."""
    actor: Actor
    if config.scheduler.type == "ray":
        ensure_ray(config)
        gpus = 1.0 if config.cluster.n_gpus_per_node and config.inference.engine == "hf" else 0.0
        actor = RayActor(
            RolloutWorker,
            config,
            model_dir,
            train,
            version=version,
            state=state,
            weights_url=weights_url,
            num_cpus=config.scheduler.rollout_cpus,
            num_gpus=gpus,
            name="rollout",
        )
    else:
        actor = ProcessActor(
            RolloutWorker, config, model_dir, train, version=version, state=state,
            weights_url=weights_url, name="rollout",
        )  # fmt: skip
    return typed(actor, RolloutHandle, rollout_watch(config))


def learner_bundles(config: Config) -> list[dict[str, float]]:
    """One placement-group bundle per learner rank: its CPUs, GPU, and node label."""
    s, n = config.scheduler, config.learner.n_ranks
    bundle = {"CPU": s.learner_cpus / n}
    if config.cluster.n_gpus_per_node:
        bundle["GPU"] = 1.0
    if s.learner_resource:
        bundle[s.learner_resource] = RESOURCE_SLIVER
    return [dict(bundle) for _ in range(n)]


def _ray_learners(
    config: Config, model_dir: str, mode: str, envs: list[dict[str, str]]
) -> LearnerGroup:
    """The ranks in a placement group (PACK, or SPREAD with scheduler.learner_spread) across
    Ray nodes; the torch.distributed rendezvous on rank 0's node."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ensure_ray(config)
    strategy = "SPREAD" if config.scheduler.learner_spread else "PACK"
    bundles = learner_bundles(config)
    group = placement_group(bundles, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise RuntimeError(
            f"Ray cannot place {config.learner.n_ranks} learner rank(s) "
            f"{bundles[0]} ({strategy}) within {PLACEMENT_TIMEOUT_S:.0f}s: "
            f"the cluster has {ray.cluster_resources()}"
        ) from None
    nodes = ray.util.placement_group_table(group)["bundles_to_node_id"]
    master = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == nodes[0])
    ranks = [
        RayActor(
            LearnerWorker, config, model_dir, mode=mode, env={**env, "MASTER_ADDR": master},
            num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0.0), name=f"learner-{r}",
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r),
        )
        for r, (env, bundle) in enumerate(zip(envs, bundles, strict=True))
    ]  # fmt: skip
    names = [f"{nodes[r]} (Ray)" for r in range(len(ranks))]
    return LearnerGroup(ranks, on_close=lambda: remove_placement_group(group), nodes=names)


class LearnerRankError(RuntimeError):
    """A learner rank failed or died; the message names the rank and its node."""


class LearnerGroup:
    """All ranks of the learner; each call goes to every rank and returns rank 0's result
    (the driver sees it as a :class:`~core.runtime.handles.LearnerHandle`)."""

    def __init__(
        self,
        ranks: Sequence[Actor],
        on_close: Callable[[], None] | None = None,
        nodes: Sequence[str] | None = None,
    ) -> None:
        self.ranks = list(ranks)
        self.nodes = list(nodes or [socket.gethostname()] * len(self.ranks))  # for error messages
        self._in_flight: list[cf.Future] = []
        self._gather = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="learner-group")
        self._on_close = on_close  # frees what placed the ranks (a Ray placement group)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on every rank; rank 0's result. The first rank to fail (or die) ends the
        call with a :class:`LearnerRankError` naming it: the others may be stuck in a collective
        with it."""
        return self.call_async(method, *args, **kwargs).result()

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> cf.Future:
        """:meth:`call` as a future; the ranks have the call before this returns."""
        # The ranks work on their own threads or processes: a signal that interrupts a wait
        # leaves the call running to completion (see wait_idle), never half-applied.
        in_flight = [rank.call_async(method, *args, **kwargs) for rank in self.ranks]
        self._in_flight = in_flight
        return self._gather.submit(self._first_result, method, in_flight)

    def _first_result(self, method: str, in_flight: list[cf.Future]) -> Any:
        cf.wait(in_flight, return_when=cf.FIRST_EXCEPTION)
        for r, future in enumerate(in_flight):
            if future.done() and future.exception() is not None:
                raise LearnerRankError(
                    f"learner rank {r} of {len(self.ranks)} (node {self.nodes[r]}) failed in "
                    f"{method}(): {future.exception()}"
                ) from future.exception()
        return in_flight[0].result()

    def node_ids(self) -> list[str]:
        """The node each rank runs on, in rank order."""
        return [typed(rank, LearnerRank).node_id() for rank in self.ranks]

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait for the last call to finish on every rank; False if it is still running."""
        _, pending = cf.wait(self._in_flight, timeout=timeout_s)
        return not pending

    def close(self) -> None:
        for rank in self.ranks:
            rank.close()
        self._gather.shutdown(wait=False, cancel_futures=True)
        if self._on_close is not None:
            self._on_close()


def start_learners(config: Config, model_dir: str, *, mode: str = "rl") -> LearnerHandle:
    """``learner.n_ranks`` learner ranks forming one FSDP2 process group (gloo on CPU)."""
    return typed(_learner_group(config, model_dir, mode), LearnerHandle, learner_watch(config))


def _learner_group(config: Config, model_dir: str, mode: str) -> LearnerGroup:
    n = config.learner.n_ranks
    if n == 1 and config.scheduler.type == "local":
        return LearnerGroup(
            [InProcessActor(LearnerWorker, config, model_dir, mode=mode, name="learner")]
        )
    port = free_port()
    envs = [
        {
            "RANK": str(r),
            "LOCAL_RANK": str(r) if not config.cluster.n_gpus_per_node else "0",
            "WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        for r in range(n)
    ]
    if config.scheduler.type == "ray":
        return _ray_learners(config, model_dir, mode, envs)
    ranks = [
        ProcessActor(
            LearnerWorker, config, model_dir, mode=mode, env=env, name=f"learner-{r}", wait=False
        )
        for r, env in enumerate(envs)
    ]
    for rank in ranks:  # all must be started before any can finish init_process_group
        rank.wait_ready()
    return LearnerGroup(ranks)
