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

from core.config.loading import run_trials
from core.runtime.checkpointing import CheckpointManager
from core.runtime.run_lock import RunLock
from core.storage import filesystem, join, read_jsonl, read_text, storage_retry

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


@storage_retry
def _experiments(fileroot: str) -> list[str]:
    fs, root = filesystem(fileroot)
    if not fs.isdir(root.rstrip("/")):
        return []
    return [e.rstrip("/").rsplit("/", 1)[-1] for e in sorted(fs.ls(root, detail=False))]


def list_runs(fileroot: str, experiment: str | None = None) -> list[RunInfo]:
    """Every run folder under ``fileroot`` (or one experiment's), newest trial last."""
    names = _experiments(fileroot)
    return [
        describe_run(join(fileroot, name, trial), name, trial)
        for name in names
        if not name.startswith("_") and experiment in (None, name)
        for trial in run_trials(fileroot, name)
    ]


def describe_run(run_dir: str, experiment: str, trial: str) -> RunInfo:
    summary = _json(join(run_dir, "summary.json"))
    owner = _live_owner(run_dir)
    state = "running" if owner else "finished" if summary is not None else "stopped"
    if summary is None:  # metrics.jsonl is read only for a run without a summary
        step, accuracy = _progress(join(run_dir, "metrics.jsonl"))
        summary = {}
    else:
        step = summary.get("version")
        accuracy = summary.get("accuracy_after") or summary.get("accuracy_before")
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


def _progress(url: str) -> tuple[int | None, float | None]:
    """(RL steps logged, the latest eval accuracy) from ``metrics.jsonl``."""
    try:
        rows = read_jsonl(url)
    except FileNotFoundError:
        return None, None
    steps = [int(r["step"]) + 1 for r in rows if "reward/mean" in r]
    accuracies = [float(r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]
    return (steps[-1] if steps else None), (accuracies[-1] if accuracies else None)


def _json(url: str) -> dict[str, Any] | None:
    try:
        return json.loads(read_text(url))
    except FileNotFoundError:
        return None
