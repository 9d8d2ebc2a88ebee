"""One job per run folder: the lock refuses a live owner, takes over a dead or silent one."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

from core.config import load_config
from core.runtime.job import run_experiment
from core.runtime.run_lock import LOCK_NAME, RunLock, RunLockedError

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"


def _plant(run_dir: Path, **record: Any) -> None:
    """A lock file left by some other job."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_NAME).write_text(json.dumps({"owner": "someone@elsewhere:1", **record}))


def test_a_second_job_fails_naming_the_owner_and_release_frees_it(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "exp" / "t1")
    with RunLock(run_dir) as first:
        record = json.loads((tmp_path / "exp" / "t1" / LOCK_NAME).read_text())
        assert record["pid"] == first.record["pid"] and record["host"] == socket.gethostname()
        with pytest.raises(RunLockedError, match=r"in use by .*:\d+ \(last heartbeat"):
            RunLock(run_dir).acquire()
    assert not (tmp_path / "exp" / "t1" / LOCK_NAME).exists()
    with RunLock(run_dir):  # free again
        pass


def test_a_lock_whose_owner_exited_on_this_host_is_taken_over(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    _plant(tmp_path, host=socket.gethostname(), pid=int(gone.stdout), heartbeat=time.time())
    with RunLock(str(tmp_path)) as lock:
        assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == lock.token


def test_another_hosts_lock_holds_until_its_heartbeat_is_stale(tmp_path: Path) -> None:
    _plant(tmp_path, host="other-node", pid=1, heartbeat=time.time() - 30)
    with pytest.raises(RunLockedError, match="someone@elsewhere:1"):
        RunLock(str(tmp_path), stale_after_s=60).acquire()
    with RunLock(str(tmp_path), stale_after_s=10) as lock:  # 30 s silent > 10 s
        assert lock.record["host"] == socket.gethostname()


def test_the_heartbeat_moves_while_the_job_runs(tmp_path: Path) -> None:
    with RunLock(str(tmp_path), heartbeat_s=0.1) as lock:
        first = lock.record["heartbeat"]
        time.sleep(0.6)
        on_disk = json.loads((tmp_path / LOCK_NAME).read_text())
        assert on_disk["heartbeat"] > first and on_disk["token"] == lock.token


@pytest.mark.integration
def test_lock_on_s3(s3_bucket: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                    s3_storage_options: dict[str, Any]) -> None:  # fmt: skip
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_storage_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_storage_options["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fsspec.filesystem("s3").clear_instance_cache()
    fs = fsspec.filesystem("s3", **s3_storage_options)
    run_dir = f"s3://{s3_bucket}/runs/exp/t"
    with RunLock(run_dir, settle_s=0.1):
        assert json.loads(fs.cat(f"{s3_bucket}/runs/exp/t/{LOCK_NAME}"))["pid"] > 0
        with pytest.raises(RunLockedError, match=f"{run_dir} is in use"):
            RunLock(run_dir, settle_s=0.1).acquire()
    fs.invalidate_cache()
    assert not fs.exists(f"{s3_bucket}/runs/exp/t/{LOCK_NAME}")


def test_a_job_on_a_locked_run_folder_fails_before_writing(tmp_path: Path) -> None:
    cfg = load_config(
        QUICKSTART,
        [f"cluster.fileroot={tmp_path}", "experiment.trial=busy", "sft.enabled=false",
         "learner.total_steps=0", "data.n_train=20", "data.n_test=4"],
    )  # fmt: skip
    run_dir = tmp_path / "quickstart" / "busy"
    with RunLock(str(run_dir)):
        with pytest.raises(RunLockedError, match="in use"):
            run_experiment(cfg)
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]  # nothing written
