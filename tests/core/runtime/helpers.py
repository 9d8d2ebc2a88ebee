"""Reading a run's outputs back, for the tests of the pipeline and the flows."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``logdir``: tag → [(step, value), ...]."""
    events = EventAccumulator(str(logdir), size_guidance={SCALARS: 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()[SCALARS]}


def servers_of(run_dir: Path) -> list[psutil.Process]:
    """A run's live inference server processes (their command lines name its files)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "core.inference.server" in cmd and str(run_dir) in cmd:
            found.append(proc)
    return found


def kill_a_server_after_the_first_step(run_dir: Path, n_servers: int, killed: list[int]) -> None:
    """``kill -9`` one of the run's servers once ``batches.jsonl`` has a row; its pid goes
    into ``killed`` (a thread's target: it gives up after 180 s)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        batches = run_dir / "batches.jsonl"
        if batches.exists() and batches.read_text().strip():
            servers = servers_of(run_dir)
            if len(servers) == n_servers:
                servers[0].send_signal(signal.SIGKILL)
                killed.append(servers[0].pid)
                return
        time.sleep(0.05)
