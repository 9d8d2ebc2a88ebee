"""Committed checkpoints under ``checkpoint.url`` (any fsspec URL), newest K kept.

Layout of one checkpoint::

    {url}/step-000020/learner/policy/   sharded learner state (DCP: model, optimizer, schedule)
    {url}/step-000020/learner/critic/   (PPO presets)
    {url}/step-000020/hf/               the policy as a from_pretrained folder
    {url}/step-000020/recover.json      version, data position, executor counters, RNG, config hash
    {url}/step-000020/COMMITTED         written last: a checkpoint without it is torn and ignored

The pair stages before RL (reward model, DPO) commit theirs, without the HF export, under
``{url}/{stage}/`` (:mod:`core.runtime.stage_resume`).

Storage calls time out and are retried with backoff (``core.storage.storage_retry``).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fsspec.core import url_to_fs

from core.config import Config
from core.storage import filesystem, join, storage_retry
from core.training import checkpoint_problems, hf_folder_problems

logger = logging.getLogger(__name__)

MARKER = "COMMITTED"
RECOVER_KEYS = ("version", "rollout", "rng", "config_hash")
_STEP = re.compile(r"step-(\d+)$")


def checkpoint_url(config: Config) -> str:
    """``checkpoint.url``, or ``{run_dir}/checkpoints`` when it is empty."""
    return config.checkpoint.url or join(config.run_dir, "checkpoints")


class CheckpointManager:
    """Lists, commits and prunes the checkpoints of one run."""

    def __init__(
        self,
        url: str,
        keep_last: int = 2,
        *,
        recover_keys: tuple[str, ...] = RECOVER_KEYS,
        with_hf: bool = True,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {keep_last}")
        self.url = url.rstrip("/")
        self.keep_last = keep_last
        self.recover_keys = recover_keys  # what a valid recover.json holds
        self.with_hf = with_hf  # whether a checkpoint holds the policy's HF export (RL's do)
        self.fs, self.root = filesystem(self.url)

    def path(self, step: int) -> str:
        return join(self.url, f"step-{step:06d}")

    @storage_retry
    def committed_steps(self) -> list[int]:
        """Steps whose checkpoint has its commit marker, oldest first."""
        if not self.fs.exists(self.root):
            return []
        self.fs.invalidate_cache(self.root)
        steps = []
        for entry in self.fs.ls(self.root, detail=False):
            match = _STEP.search(entry.rstrip("/"))
            if match and self.fs.exists(f"{entry.rstrip('/')}/{MARKER}"):
                steps.append(int(match.group(1)))
        return sorted(steps)

    def latest(self) -> int | None:
        steps = self.committed_steps()
        return steps[-1] if steps else None

    @storage_retry
    def begin(self, step: int) -> None:
        """Before writing ``step``: a checkpoint already there (a skipped corrupt one, or from
        a run restarted without recover) stops looking committed until the new one commits."""
        _, base = url_to_fs(self.path(step))
        if self.fs.exists(f"{base}/{MARKER}"):
            self.fs.rm(f"{base}/{MARKER}")

    @storage_retry
    def commit(self, step: int, recover: dict[str, Any]) -> None:
        """Write ``recover.json`` then the marker (last), then drop checkpoints beyond ``keep_last``."""
        _, base = url_to_fs(self.path(step))
        self.fs.makedirs(base, exist_ok=True)
        with self.fs.open(f"{base}/recover.json", "w") as f:
            f.write(json.dumps(recover, indent=1, sort_keys=True, default=str))
        with self.fs.open(f"{base}/{MARKER}", "w") as f:
            f.write(str(step))
        logger.info("committed checkpoint %s", self.path(step))
        self._prune()

    @storage_retry  # OSError only: a recover.json that is not JSON is corrupt, not transient
    def load_recover(self, step: int) -> dict[str, Any]:
        _, base = url_to_fs(self.path(step))
        with self.fs.open(f"{base}/recover.json", "r") as f:
            return json.loads(f.read())

    def problems(self, step: int) -> list[str]:
        """Why the committed checkpoint at ``step`` cannot be resumed from ([] = it can):
        recover.json unreadable or incomplete, a learner state or the HF export corrupt."""
        try:
            recover = self.load_recover(step)
        except (OSError, ValueError) as err:
            return [f"{self.path(step)}/recover.json unreadable: {err}"]
        missing = [key for key in self.recover_keys if key not in recover]
        if missing:
            return [f"{self.path(step)}/recover.json lacks {missing}"]
        _, learner = url_to_fs(join(self.path(step), "learner"))
        roles = self.fs.ls(learner, detail=False) if self.fs.isdir(learner) else []
        if not roles:
            return [f"{self.path(step)}/learner holds no learner state"]
        problems = []
        for role in sorted(roles):
            name = role.rstrip("/").rsplit("/", 1)[-1]
            problems += checkpoint_problems(join(self.path(step), "learner", name))
        if self.with_hf:
            problems += hf_folder_problems(join(self.path(step), "hf"))
        return problems

    def _prune(self) -> None:
        steps = self.committed_steps()
        for old in steps[: max(0, len(steps) - self.keep_last)]:
            _, base = url_to_fs(self.path(old))
            # Remove the marker first: a half-deleted checkpoint must never look committed.
            self.fs.rm(f"{base}/{MARKER}")
            self.fs.rm(base, recursive=True)
            logger.info("removed old checkpoint %s", self.path(old))
