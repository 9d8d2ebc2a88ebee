"""Publishing the learner's weights to the engines, and the folders that carry them.

Each RL step ends with :meth:`Publisher.publish`: the learner's new policy becomes the engines'
``version``. Two ways, as ``inference.weight_sync`` says:

- ``disk`` (default): the learner exports a HF folder under ``{run_dir}/weights/v000007`` and the
  rollout worker swaps it in (our engine pauses, aborts in-flight requests, loads, resumes;
  servers get SGLang's ``/update_weights_from_disk``). Servers and Ray nodes may share no disk
  with the driver: with a remote run folder the starting weights and each version are uploaded
  under it and fetched there. The previous version's folder is removed once the engine has the
  new one.
- ``distributed``: by broadcast over a process group, with SGLang's own protocol, no folder
  written or read (:class:`BroadcastSync`). At the start the learner's rank 0 opens the group
  (rank 0, hosting its store) while every server joins it (``/init_weights_update_group``, ranks
  1..n); both calls block until all have joined, so the driver makes them at once. Per version,
  the servers' ``/update_weights_from_distributed`` (the rollout worker, which pauses generation
  first) and the learner's broadcast run at once. The learner ranks gather the full state
  together; rank 0 sends it. A server that rejects an update, or dies during one, leaves the
  broadcast waiting for the group's timeout
  (:data:`core.inference.weight_broadcast.DEFAULT_TIMEOUT_S`); the run then fails with that
  error. Weight groups are per run: every server and the learner leave theirs when it ends.

A server of the run's fleet found dead before the learner's update is restarted from the
learner's current policy and rejoins (:meth:`Publisher.restart_dead_servers`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import shutil
import time
from pathlib import Path

from core.config import Config
from core.runtime.fleet import ServerFleet, free_port
from core.runtime.handles import LearnerHandle, RolloutHandle
from core.storage import exists, is_local, join, local_path, remove_dir, upload_dir

logger = logging.getLogger(__name__)

GROUP_NAME = "asyncrl-weights"


class BroadcastSync:
    """The learner → servers weight group of one run (see the module docstring)."""

    def __init__(
        self, learners: LearnerHandle, rollout: RolloutHandle, n_servers: int, backend: str
    ) -> None:
        self.learners, self.rollout = learners, rollout
        self.n_servers, self.backend = n_servers, backend
        self.metadata: dict[str, list] = {}
        self._pool: cf.ThreadPoolExecutor | None = None

    def open(self) -> None:
        """Learner rank 0 and every server join the group (its store on rank 0's node); the
        tensors' order is agreed."""
        master_address = self.learners.node_address()
        port = free_port(master_address)
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="weight-broadcast")
        learner = self._pool.submit(
            self.learners.open_weight_group, master_address, port, 1 + self.n_servers,
            GROUP_NAME, self.backend,
        )  # fmt: skip
        self.rollout.init_weight_group(master_address, port, GROUP_NAME, self.backend)
        learner.result()
        self.metadata = self.learners.weight_metadata()
        logger.info(
            "weight group %r: learner rank 0 + %d server(s), %s, %d tensors",
            GROUP_NAME, self.n_servers, self.backend, len(self.metadata["names"]),
        )  # fmt: skip

    def publish(self, version: int) -> None:
        """The learner's current policy becomes ``version`` on every server."""
        assert self._pool is not None, "open() first"
        sent = self._pool.submit(self.learners.broadcast_weights)
        self.rollout.update_weights_distributed(self.metadata, version, GROUP_NAME)
        sent.result()

    def close(self) -> None:
        try:
            self.rollout.destroy_weight_group(GROUP_NAME)
        except Exception:  # the run is ending: the servers drop the group when they stop
            logger.warning("could not close the servers' weight group", exc_info=True)
        self.learners.close_weight_group()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class Publisher:
    """Where one run's weights go: the local folders, their uploads, the weight group."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.root = local_path(join(config.run_dir, "weights"))
        # Servers and Ray nodes may share no disk with the driver (see the module docstring).
        distributed = config.inference.engine != "hf" or config.scheduler.type == "ray"
        remote = distributed and not is_local(config.run_dir)
        self.url = join(config.run_dir, "weights") if remote else None
        self.broadcast: BroadcastSync | None = None
        self.fleet: ServerFleet | None = None  # the servers this run launched

    @property
    def weights_roots(self) -> list[str | Path | None]:
        """Where the run's servers may load weights from (their allow-list)."""
        return [self.root, self.url]

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def share(self, directory: str, name: str) -> str:
        """``directory``, or its copy under :attr:`url` (uploaded once) for nodes without the
        driver's disk."""
        if self.url is None:
            return directory
        url = join(self.url, name)
        if not exists(join(url, "config.json")):
            upload_dir(directory, url)
        return url

    def upload(self, directory: Path, version: int) -> str | None:
        """``directory`` uploaded as ``version`` under :attr:`url`, when servers fetch weights
        from there; its URL (else None: they read local folders)."""
        if self.url is None:
            return None
        url = join(self.url, f"v{version:06d}")
        upload_dir(directory, url)
        return url

    def open_broadcast(
        self, learners: LearnerHandle, rollout: RolloutHandle, n_servers: int
    ) -> None:
        """``inference.weight_sync=distributed``: form the weight group (NCCL on GPUs, else gloo)."""
        backend = "nccl" if self.config.cluster.n_gpus_per_node else "gloo"
        self.broadcast = BroadcastSync(learners, rollout, n_servers, backend)
        self.broadcast.open()

    def publish(self, learners: LearnerHandle, rollout: RolloutHandle, version: int) -> float:
        """The learner's current policy becomes the engines' ``version``; returns seconds."""
        t0 = time.perf_counter()
        if self.broadcast is not None:  # no folder: the servers receive the tensors
            self.broadcast.publish(version)
            return time.perf_counter() - t0
        directory = self.folder(version)
        learners.export(str(directory))
        rollout.update_weights(self.upload(directory, version) or str(directory), version)
        previous = self.folder(version - 1)
        if previous.exists():  # the engine has loaded the new folder; the old one is done
            shutil.rmtree(previous, ignore_errors=True)
        if self.url:
            remove_dir(join(self.url, f"v{version - 1:06d}"))
        return time.perf_counter() - t0

    def restart_dead_servers(
        self, learners: LearnerHandle, rollout: RolloutHandle, version: int
    ) -> None:
        """Servers of this run that died are started again from the learner's current policy
        (``version``) and rejoin. Meanwhile their requests went to the others (the client
        resubmits them whole), so no episode is lost or counted twice."""
        dead = self.fleet.dead() if self.fleet is not None else []
        if not dead:
            return
        folder = self.folder(version)
        if not folder.is_dir():
            learners.export(str(folder))
        source = self.upload(folder, version) or str(folder)
        assert self.fleet is not None
        addresses = self.fleet.restart(dead, source, version)
        if self.broadcast is not None:  # the group had a fixed membership: form it again
            self.broadcast.close()
            self.broadcast.open()
            shutil.rmtree(folder, ignore_errors=True)  # no publish will replace this folder
        rollout.restore_servers(addresses)
        logger.warning("restarted inference server(s) %s at version %d", addresses, version)

    def write_hf(self, learners: LearnerHandle, version: int, url: str) -> Path:
        """The policy at ``version`` as a HF folder at ``url``: a copy of the folder just published
        to the engine when there is one (no second full-state gather), else a fresh export."""
        out = local_path(url)
        published = self.folder(version)
        if published.is_dir():
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(published, out)
        else:
            learners.export(str(out))
        upload_dir(out, url)  # a no-op for a local url
        return out

    def close(self) -> None:
        """Leave the weight group, if one was formed."""
        if self.broadcast is not None:
            self.broadcast.close()
            self.broadcast = None
