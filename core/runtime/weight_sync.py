"""``rollout.weight_sync=distributed``: new weights go from the learner to the inference servers
by broadcast over a process group, with SGLang's own protocol — no folder written or read.

At the start the learner's rank 0 opens the group (rank 0, hosting its store) while every server
joins it (``/init_weights_update_group``, ranks 1..n); both calls block until all have joined,
so the driver makes them at once. Per version, the servers' ``/update_weights_from_distributed``
(the rollout worker, which pauses generation first) and the learner's broadcast run at once. The
learner ranks gather the full state together; rank 0 sends it.

A server that rejects an update, or dies during one, leaves the broadcast waiting for the group's
timeout (:data:`core.inference.weight_broadcast.DEFAULT_TIMEOUT_S`); the run then fails with that
error. A server found dead before the learner's update is restarted and the group formed again
(:meth:`core.runtime.trainer.Trainer._restart_dead_servers`).
Weight groups are per run: every server and the learner leave theirs when the run ends.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging

from core.runtime.fleet import free_port
from core.runtime.handles import LearnerHandle, RolloutHandle

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
