"""One job per run folder: a lock file with its owner and a heartbeat, on any fsspec URL.

``{run_dir}/LOCK`` holds ``{"owner", "host", "pid", "started", "heartbeat", "token"}``. A job
takes it before its first write and a thread refreshes the heartbeat while the job runs; the
job deletes it at the end (also on an exception or SIGTERM, which unwinds). A second job on the
same folder fails at once, naming the owner, unless the lock is *stale*:

- its owner ran on this host and that process is gone (a ``kill -9``: resume at once), or
- its heartbeat is older than ``stale_after_s`` (an owner on another host that died).

A local lock is created atomically (``O_EXCL``). Object stores have no create-if-absent here, so
for them the job writes its record and reads it back after a short settle: of two jobs starting
in the same second the later writer wins and the other fails, which is as good as it gets
without conditional writes.

Every read, write and delete of the lock goes through :mod:`core.storage`: bounded, logged
retries and timeouts, so a silent object store fails the job's start with the URL named.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from core.config import Config
from core.storage import filesystem, is_local, join, read_text, remove_file, write_text

logger = logging.getLogger(__name__)

LOCK_NAME = "LOCK"


class RunLockedError(RuntimeError):
    """Another live job owns the run folder."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused PID apart)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return started is None or _start_time(pid) in (None, started)


@dataclass
class RunLock:
    """The lock of one run folder; use as a context manager around the job."""

    run_dir: str
    stale_after_s: float = 120.0
    heartbeat_s: float = 15.0
    settle_s: float = 1.0  # object stores: wait this long before reading our record back

    def __post_init__(self) -> None:
        self.url = join(self.run_dir, LOCK_NAME)
        self.fs, self.path = filesystem(self.url)
        self.token = uuid.uuid4().hex
        self.record: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ acquire / release
    def acquire(self) -> None:
        current = self.read()
        if current is not None:
            why = self.stale_reason(current)
            if why is None:
                raise RunLockedError(self._owned_message(current))
            logger.warning("taking over the lock of %s: %s", self.run_dir, why)
            remove_file(self.url)
        pid = os.getpid()
        now = time.time()
        self.record = {
            "owner": f"{os.environ.get('USER', 'unknown')}@{socket.gethostname()}:{pid}",
            "host": socket.gethostname(),
            "pid": pid,
            "pid_started": _start_time(pid),
            "started": now,
            "heartbeat": now,
            "token": self.token,
        }
        self._create()
        self._thread = threading.Thread(target=self._beat, name="run-lock", daemon=True)
        self._thread.start()
        logger.info("locked run folder %s", self.run_dir)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        current = self.read()
        if current is not None and current.get("token") == self.token:
            remove_file(self.url)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    # ------------------------------------------------------------------ pieces
    def _create(self) -> None:
        blob = json.dumps(self.record)
        if is_local(self.url):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)  # object stores have no folders
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise RunLockedError(self._owned_message(self.read() or {})) from None
            with os.fdopen(fd, "w") as f:
                f.write(blob)
            return
        self._write(blob)
        time.sleep(self.settle_s)
        current = self.read()
        if current is None or current.get("token") != self.token:
            raise RunLockedError(self._owned_message(current or {}))

    def _write(self, blob: str) -> None:
        """Replace the record whole: a reader never sees a half-written one (``write_text``)."""
        write_text(self.url, blob)

    def read(self) -> dict[str, Any] | None:
        """The lock's record, or None when the folder is not locked."""
        try:
            return json.loads(read_text(self.url))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):  # not ours to judge: age by mtime
            return {"owner": "an unreadable lock file", "heartbeat": self._modified()}

    def _modified(self) -> float:
        try:
            return self.fs.modified(self.path).timestamp()
        except (OSError, NotImplementedError):
            return time.time()

    def stale_reason(self, record: dict[str, Any]) -> str | None:
        """Why ``record`` no longer holds the folder, or None while its owner may be alive."""
        if record.get("host") == socket.gethostname() and "pid" in record:
            if not _alive(int(record["pid"]), record.get("pid_started")):
                return f"its owner {record.get('owner')} is no longer running"
            return None
        age = time.time() - float(record.get("heartbeat", 0.0))
        if age > self.stale_after_s:
            return f"its owner {record.get('owner')} sent no heartbeat for {age:.0f} s"
        return None

    def _owned_message(self, record: dict[str, Any]) -> str:
        age = time.time() - float(record.get("heartbeat", time.time()))
        return (
            f"run folder {self.run_dir} is in use by {record.get('owner', 'another job')} "
            f"(last heartbeat {age:.0f} s ago). Wait for that job, choose another "
            f"experiment.trial, or delete {self.url} if the job is gone (a lock from another "
            f"host is taken over after {self.stale_after_s:.0f} s without a heartbeat)."
        )

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                current = self.read()
                if current is None or current.get("token") != self.token:
                    logger.error("the lock of %s was taken by another job", self.run_dir)
                    return
                self.record["heartbeat"] = time.time()
                self._write(json.dumps(self.record))
            except OSError as err:  # storage hiccup: try again at the next beat
                logger.warning("run lock heartbeat failed: %s", err)


def lock_run(config: Config) -> RunLock:
    """The lock of ``config``'s run folder (a context manager)."""
    return RunLock(config.run_dir, stale_after_s=config.cluster.lock_stale_s)
