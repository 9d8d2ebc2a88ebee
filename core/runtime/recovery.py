"""What an RL checkpoint records beyond the learner's state, and how a run resumes from one.

A checkpoint's ``recover.json`` (:meth:`Recovery.record`) holds the version, the rollout
worker's state (data position, settled draws, counters: see
:meth:`core.runtime.rollout_worker.RolloutWorker.state_dict`), the driver's RNG states, the
config and its hash, and the evals so far. ``checkpoint.recover=auto``
(:meth:`Recovery.resume`) starts from the newest committed checkpoint that passes
:meth:`~core.runtime.checkpointing.CheckpointManager.problems` (a corrupt newer one is skipped,
saying why), warns naming every setting that differs from the checkpoint's config, and drops
the ``batches.jsonl`` rows of the steps it will train again. The checkpoints themselves (layout,
commit marker, pruning) are :mod:`core.runtime.checkpointing`'s.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.config import Config, config_changes, config_hash, run_params
from core.runtime.checkpointing import CheckpointManager
from core.storage import download_dir, download_file, exists, is_local, join

logger = logging.getLogger(__name__)


def rng_state() -> dict[str, Any]:
    """The driver's RNG states as JSON-friendly lists."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


@dataclass
class Resume:
    """Where an RL stage starts: fresh (version 0) or from a checkpoint."""

    version: int
    init_dir: str  # the folder the engine starts from (the checkpoint's HF export on resume)
    rollout_state: dict[str, Any] | None = None  # the rollout worker's, None when fresh
    evals: list[dict[str, Any]] = field(default_factory=list)  # the evals before the checkpoint


class Recovery:
    """Records and reads back one run's ``recover.json`` (see the module docstring)."""

    def __init__(
        self, config: Config, ckpt: CheckpointManager, model_dir: str, batches_path: Path
    ) -> None:
        self.config = config
        self.ckpt = ckpt
        self.model_dir = model_dir
        self.batches_path = batches_path

    def record(
        self, version: int, rollout_state: dict[str, Any], evals: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """``recover.json`` for a checkpoint at ``version`` (the driver's RNG as it is now)."""
        return {
            "version": version,
            "rollout": rollout_state,
            "rng": rng_state(),
            "config_hash": config_hash(self.config),
            "config": run_params(self.config),
            "evals": evals,
        }

    def resume(self) -> Resume:
        """Fresh, or from the newest valid committed checkpoint (``checkpoint.recover=auto``);
        the driver's RNG is restored and ``batches.jsonl`` cut to the steps before it."""
        if self.config.checkpoint.recover != "auto":
            self.truncate_batches(0)
            return Resume(0, self.model_dir)
        step = None
        for candidate in reversed(self.ckpt.committed_steps()):
            problems = self.ckpt.problems(candidate)
            if not problems:
                step = candidate
                break
            logger.warning(
                "recover=auto: skipping checkpoint %s: %s",
                self.ckpt.path(candidate),
                "; ".join(problems),
            )
        if step is None:
            logger.info(
                "recover=auto: no valid committed checkpoint under %s, starting fresh",
                self.ckpt.url,
            )
            self.truncate_batches(0)
            return Resume(0, self.model_dir)
        recover = self.ckpt.load_recover(step)
        if recover["config_hash"] != config_hash(self.config):
            changes = config_changes(recover.get("config", {}), self.config)
            logger.warning(
                "resuming %s with a config that differs from the checkpoint's: %s",
                self.ckpt.path(step),
                "; ".join(changes) or "(the checkpoint does not list its config)",
            )
        set_rng_state(recover["rng"])
        hf_local = download_dir(join(self.ckpt.path(step), "hf"))
        version = int(recover["version"])
        logger.info("recover=auto: resuming from %s (version %d)", self.ckpt.path(step), version)
        self.truncate_batches(version)
        # The engine starts from the checkpoint's HF export at its version: ours loads it, the
        # run's servers are launched from it, running servers are sent it (RolloutWorker).
        return Resume(version, str(hf_local), recover["rollout"], list(recover.get("evals", [])))

    def truncate_batches(self, start: int) -> None:
        """Drop ``batches.jsonl`` rows of steps ≥ ``start``: the resumed run trains them again.

        The file grows locally; a remote run folder's copy (uploaded at the end) is fetched first.
        """
        remote = join(self.config.run_dir, "batches.jsonl")
        if not self.batches_path.exists() and not is_local(remote) and exists(remote):
            download_file(remote, self.batches_path)
        if not self.batches_path.exists():
            return
        lines = self.batches_path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line)["step"] < start]
        if len(kept) < len(lines):
            logger.info(
                "batches.jsonl: dropped %d rows of steps >= %d", len(lines) - len(kept), start
            )
            staging = self.batches_path.with_suffix(".jsonl.tmp")
            staging.write_text("".join(kept))
            staging.replace(self.batches_path)
