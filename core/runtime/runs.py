"""The runs under a fileroot, as an operator asks about them: which are running, how far they
got, what they scored, where they are tracked (``asyncrl runs``).

A run folder is ``{fileroot}/{experiment}/{trial}`` with a ``config.yaml``. Its state:
``running`` while a live job holds its lock, ``finished`` once ``summary.json`` is written, else
``stopped`` (killed or crashed; ``checkpoint.recover=auto`` resumes it from its newest
checkpoint). Reads files only: no tracking server needs to be up.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from fsspec.core import url_to_fs

from core.runtime.checkpointing import CheckpointManager
from core.runtime.run_lock import RunLock
from core.storage import join

logger = logging.getLogger(__name__)


@dataclass
class RunInfo:
    """One run folder, summarised."""

    experiment: str
    trial: str
    run_dir: str
    state: str  # running | finished | stopped
    step: int | None  # RL steps done (as logged)
    accuracy: float | None  # the latest held-out accuracy
    checkpoint: int | None  # the newest committed checkpoint's version
    owner: str | None  # the job holding the lock, while running
    mlflow: str | None  # the MLflow run's URL, or its id
    prefect_flow_run: str | None


def list_runs(fileroot: str, experiment: str | None = None) -> list[RunInfo]:
    """Every run folder under ``fileroot`` (or one experiment's), newest trial last."""
    fs, root = url_to_fs(fileroot)
    root = root.rstrip("/")
    if not fs.isdir(root):
        return []
    runs = []
    for exp_dir in sorted(fs.ls(root, detail=False)):
        name = exp_dir.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith("_") or (experiment and name != experiment) or not fs.isdir(exp_dir):
            continue
        for trial_dir in sorted(fs.ls(exp_dir, detail=False)):
            if fs.exists(f"{trial_dir.rstrip('/')}/config.yaml"):
                trial = trial_dir.rstrip("/").rsplit("/", 1)[-1]
                runs.append(describe_run(join(fileroot, name, trial), name, trial))
    return runs


def describe_run(run_dir: str, experiment: str, trial: str) -> RunInfo:
    fs, path = url_to_fs(run_dir)
    summary = _json(fs, f"{path}/summary.json")
    owner = _live_owner(run_dir)
    state = "running" if owner else "finished" if summary is not None else "stopped"
    step, accuracy = _progress(fs, f"{path}/metrics.jsonl")
    if summary is not None:
        step = summary.get("version", step)
        accuracy = summary.get("accuracy_after") or summary.get("accuracy_before") or accuracy
    summary = summary or {}
    ckpt = CheckpointManager(summary.get("checkpoint_url") or join(run_dir, "checkpoints"))
    return RunInfo(
        experiment=experiment,
        trial=trial,
        run_dir=run_dir,
        state=state,
        step=step,
        accuracy=accuracy,
        checkpoint=ckpt.latest(),
        owner=owner,
        mlflow=summary.get("mlflow_run_url") or summary.get("mlflow_run_id"),
        prefect_flow_run=summary.get("prefect_flow_run_id") or None,
    )


def _live_owner(run_dir: str) -> str | None:
    """The owner named in the run's lock, if that job is alive (same rule as taking it over)."""
    lock = RunLock(run_dir)
    record = lock.read()
    if record is None or lock.stale_reason(record) is not None:
        return None
    return str(record.get("owner", "?"))


def _progress(fs: Any, path: str) -> tuple[int | None, float | None]:
    """(RL steps logged, the latest eval accuracy) from ``metrics.jsonl``."""
    if not fs.exists(path):
        return None, None
    step = accuracy = None
    with fs.open(path, "r") as f:
        for line in f:
            row = json.loads(line)
            if "reward/mean" in row:
                step = int(row["step"]) + 1
            if row.get("eval/accuracy") is not None:
                accuracy = float(row["eval/accuracy"])
    return step, accuracy


def _json(fs: Any, path: str) -> dict[str, Any] | None:
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        return json.load(f)
