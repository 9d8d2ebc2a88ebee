"""Where the rollout worker and the learner ranks run: Ray actors or local processes.

``scheduler.type=ray`` places them as Ray actors with the configured CPU/GPU resources
(``cluster.ray_address`` joins an existing cluster; otherwise a local Ray starts);
``scheduler.type=local`` starts plain subprocesses (one learner rank runs in the driver itself).
Either way the rollout side is a separate process from the learner, so they run concurrently.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from core.config import Config
from core.runtime.actors import Actor, InProcessActor, ProcessActor, RayActor
from core.runtime.learner_worker import LearnerWorker
from core.runtime.rollout_worker import RolloutWorker
from core.training.distributed import free_port

logger = logging.getLogger(__name__)


def ensure_ray(config: Config) -> None:
    """Connect to ``cluster.ray_address`` or start a local Ray sized for this run."""
    import ray

    if ray.is_initialized():
        return
    with _keep_sigterm_handler():
        if config.cluster.ray_address:
            ray.init(address=config.cluster.ray_address, log_to_driver=False)
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
) -> Actor:
    """The rollout worker (engine + executor) in its own process."""
    if config.scheduler.type == "ray":
        ensure_ray(config)
        gpus = 1.0 if config.cluster.n_gpus_per_node and config.rollout.engine == "hf" else 0.0
        return RayActor(
            RolloutWorker,
            config,
            model_dir,
            train,
            version=version,
            state=state,
            num_cpus=config.scheduler.rollout_cpus,
            num_gpus=gpus,
            name="rollout",
        )
    return ProcessActor(
        RolloutWorker, config, model_dir, train, version=version, state=state, name="rollout"
    )


class LearnerGroup:
    """All ranks of the learner; each call goes to every rank and returns rank 0's result."""

    def __init__(self, ranks: Sequence[Actor]) -> None:
        self.ranks = list(ranks)
        self._in_flight: list[cf.Future] = []

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        # The ranks work on their own threads or processes: a signal that interrupts this wait
        # leaves the call running to completion (see wait_idle), never half-applied.
        self._in_flight = [rank.call_async(method, *args, **kwargs) for rank in self.ranks]
        return [f.result() for f in self._in_flight][0]

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait for the last call to finish on every rank; False if it is still running."""
        _, pending = cf.wait(self._in_flight, timeout=timeout_s)
        return not pending

    def close(self) -> None:
        for rank in self.ranks:
            rank.close()


def start_learners(config: Config, model_dir: str, *, mode: str = "rl") -> LearnerGroup:
    """``learner.n_ranks`` learner ranks forming one FSDP2 process group (gloo on CPU)."""
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
        ensure_ray(config)
        if n > 1 and config.cluster.n_nodes > 1:
            raise NotImplementedError(
                "multi-node learner groups need MASTER_ADDR of rank 0's node; "
                "run one node per learner group for now"
            )
        gpus = 1.0 if config.cluster.n_gpus_per_node else 0.0
        per_rank_cpus = config.scheduler.learner_cpus / n
        return LearnerGroup(
            [
                RayActor(
                    LearnerWorker,
                    config,
                    model_dir,
                    mode=mode,
                    env=env,
                    num_cpus=per_rank_cpus,
                    num_gpus=gpus,
                    name=f"learner-{r}",
                )
                for r, env in enumerate(envs)
            ]
        )
    ranks = [
        ProcessActor(
            LearnerWorker, config, model_dir, mode=mode, env=env, name=f"learner-{r}", wait=False
        )
        for r, env in enumerate(envs)
    ]
    for rank in ranks:  # all must be started before any can finish init_process_group
        rank.wait_ready()
    return LearnerGroup(ranks)
