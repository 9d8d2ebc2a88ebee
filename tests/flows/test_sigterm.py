"""SIGTERM (what Prefect cancellation, Slurm and Kubernetes send) stops the whole job.

`asyncrl run` is started as a user starts it; once it is in SFT (through the Prefect flow) or in
RL (plain loop), its main process (or its whole process group, as Slurm and a terminal signal)
gets SIGTERM. It must exit non-zero with a message within seconds, and every process it started —
Prefect's temporary API server, the rollout worker — must be gone.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from core.config import load_config
from core.runtime.checkpointing import CheckpointManager
from core.runtime.job import run_experiment

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
SMALL = [
    "data.n_train=200",
    "data.n_test=16",
    "eval.n_problems=16",
    "eval.max_new_tokens=8",
    "rollout.batch_size=4",
    "algorithm.group_size=2",
    "sampling.max_new_tokens=8",
    "eval.every_n_steps=0",
    "checkpoint.every_n_steps=0",
]


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _terminate_when(
    overrides: list[str],
    tmp_path: Path,
    ready: str,
    wanted: str,
    options: tuple[str, ...] = (),
    whole_group: bool = False,
) -> tuple[int, str, list[psutil.Process], float]:
    """Run the CLI until metrics.jsonl has a row with key ``ready`` and a process of its own runs
    a command containing ``wanted``; SIGTERM its main process (``whole_group``: every process in
    its group); return (exit code, stderr, the processes it had started, seconds to exit)."""
    exe = Path(sys.executable).parent / "asyncrl"
    env = {**os.environ, "COLUMNS": "200", "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    log = tempfile.TemporaryFile("w+")  # not a pipe: one read only at the end could fill up
    proc = subprocess.Popen(
        [str(exe), "run", *options, QUICKSTART, *SMALL, *overrides,
         f"cluster.fileroot={tmp_path}", "experiment.trial=t"],
        env=env, stdout=subprocess.DEVNULL, stderr=log, text=True, start_new_session=True,
    )  # fmt: skip

    def stderr() -> str:
        log.seek(0)
        return log.read()

    metrics = tmp_path / "quickstart" / "t" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, f"run ended early: {stderr()[-3000:]}"
            assert time.monotonic() < deadline, "the run never reached the stage"
            rows = metrics.read_text().splitlines() if metrics.exists() else []
            children = psutil.Process(proc.pid).children(recursive=True)
            started = any(wanted in _command(child) for child in children)
            if started and any(ready in json.loads(row) for row in rows):
                break
            time.sleep(0.2)
        signalled = time.monotonic()
        if whole_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 120 s after SIGTERM: {stderr()[-4000:]}")
        return code, stderr(), children, time.monotonic() - signalled
    finally:
        if proc.poll() is None:  # the test failed: leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _assert_all_stopped(children: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 20
    while not all(_gone(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(c) for c in children), [c.cmdline()[:4] for c in children if not _gone(c)]


def _flow_run_states(prefect_home: Path) -> list[str]:
    """The state of each flow run in the temporary server's database (read after it stopped)."""
    with sqlite3.connect(prefect_home / "prefect.db") as db:
        return [row[0] for row in db.execute("SELECT state_type FROM flow_run")]


def test_sigterm_during_sft_in_the_flow_stops_prefects_server(tmp_path: Path) -> None:
    # Prefect's temporary API server (uvicorn) is the child that used to be orphaned. A signal to
    # the whole group used to stop it at once, leaving the run RUNNING and the main process in
    # Prefect's client retries for minutes: it must stay up until the crash is recorded.
    code, stderr, children, seconds = _terminate_when(
        ["sft.steps=2000"], tmp_path, "sft/loss", "uvicorn", whole_group=True
    )
    assert code == 143, stderr[-3000:]
    assert "terminated (SIGTERM)" in stderr
    assert seconds < 30, f"exit took {seconds:.0f} s: {stderr[-3000:]}"
    _assert_all_stopped(children)
    assert _flow_run_states(tmp_path / "prefect") == ["CRASHED"]


def test_sigterm_during_rl_stops_the_rollout_worker_and_checkpoints(tmp_path: Path) -> None:
    overrides = ["sft.enabled=false", "learner.total_steps=500", "checkpoint.on_signal=true"]
    # the rollout worker is a multiprocessing child, forked from the job's forkserver
    code, stderr, children, seconds = _terminate_when(
        overrides, tmp_path, "reward/mean", "multiprocessing.forkserver", options=("--plain",)
    )
    assert code == 143, stderr[-3000:]
    assert seconds < 30, f"exit (with the final checkpoint) took {seconds:.0f} s"
    assert "terminated (SIGTERM)" in stderr
    _assert_all_stopped(children)
    # checkpoint.on_signal: a final checkpoint, committed, that a resumed run starts from
    ckpt = CheckpointManager(str(tmp_path / "quickstart" / "t" / "checkpoints"))
    version = ckpt.latest()
    assert version is not None and version >= 1, stderr[-3000:]
    assert "final checkpoint at version" in stderr and ckpt.problems(version) == []
    resumed = load_config(
        QUICKSTART,
        [*SMALL, "sft.enabled=false", f"cluster.fileroot={tmp_path}", "experiment.trial=t",
         f"learner.total_steps={version + 1}", "checkpoint.recover=auto"],
    )  # fmt: skip
    assert run_experiment(resumed)["steps"] == 1


@pytest.mark.integration
def test_sigterm_with_the_ray_scheduler_stops_ray(tmp_path: Path) -> None:
    overrides = ["sft.enabled=false", "learner.total_steps=500", "scheduler.type=ray"]
    code, stderr, children, seconds = _terminate_when(
        overrides, tmp_path, "reward/mean", "raylet", options=("--plain",)
    )
    assert code == 143, stderr[-3000:]
    assert seconds < 30, f"exit (Ray's shutdown) took {seconds:.0f} s"
    _assert_all_stopped(children)  # raylet, GCS, the actors' workers
