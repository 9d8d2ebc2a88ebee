"""How a run shows its stages on stderr: rich bars in a terminal, else progress lines.

When output goes to a pipe or a file, bars cannot redraw: :class:`LineProgress` writes a line
for the running stage at least every ``ASYNCRL_PROGRESS_INTERVAL_S`` seconds (default 15) —
``sft_warm_start 120/600 (19.8/s, ETA 24 s)`` — and one when it ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from core.runtime.job import StageProgress  # imports torch: not at start-up

logger = logging.getLogger(__name__)


def _bars(console: Console) -> Progress:
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    return Progress(*columns, console=console, transient=False)


def _stage_progress(progress: Progress) -> StageProgress:
    def start(name: str, total: int | None) -> Callable[[int], None]:
        task = progress.add_task(name, total=total)
        if total is None:
            progress.update(task, total=1, completed=1)
        return lambda n: progress.advance(task, n)

    return start


PROGRESS_INTERVAL_VAR = "ASYNCRL_PROGRESS_INTERVAL_S"
DEFAULT_PROGRESS_INTERVAL_S = 15.0


def _duration(seconds: float) -> str:
    """``24 s``, ``4 min 10 s``, ``1 h 5 min``."""
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


@dataclass
class _Stage:
    name: str
    total: int | None
    started: float
    done: int = 0

    def line(self, now: float, end: bool = False) -> str:
        """``sft_warm_start 120/600 (19.8/s, ETA 24 s)``; at its end ``... done in 30 s``."""
        elapsed = now - self.started
        if self.total is None:
            return f"{self.name} {'done in' if end else 'running,'} {_duration(elapsed)}"
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if end:
            left = "done in" if self.done >= self.total else "stopped after"
            when = f"{left} {_duration(elapsed)}"
        else:
            when = f"ETA {_duration((self.total - self.done) / rate)}" if rate > 0 else "ETA ?"
        return f"{self.name} {self.done}/{self.total} ({rate:.1f}/s, {when})"


class LineProgress:
    """Stage progress as plain lines, for a log file or a pipe where a live bar cannot redraw.

    A line for the running stage at least every ``interval_s`` (name, step/total, rate, ETA),
    and one when it ends: its total reached, the next stage started, or the display closed.
    """

    def __init__(self, write: Callable[[str], None], interval_s: float) -> None:
        self._write = write
        self._interval = interval_s
        self._stage: _Stage | None = None
        self._last = time.monotonic()  # when the last line was written
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._every_interval, name="progress", daemon=True)

    def __enter__(self) -> LineProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._thread.join()
        with self._lock:
            self._end()

    def start(self, name: str, total: int | None) -> Callable[[int], None]:
        """The :data:`StageProgress` hook: a new stage (ending the previous one)."""
        stage = _Stage(name, total, time.monotonic())
        with self._lock:
            self._end()
            self._stage = stage
            self._last = stage.started

        def advance(n: int) -> None:
            with self._lock:
                stage.done += n
                if stage is self._stage and total is not None and stage.done >= total:
                    self._end()

        return advance

    def _emit(self, stage: _Stage, end: bool = False) -> None:
        self._last = time.monotonic()
        self._write(stage.line(self._last, end))

    def _end(self) -> None:
        if self._stage is not None:
            self._emit(self._stage, end=True)
            self._stage = None

    def _every_interval(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                if self._stage is None:
                    wait = self._interval
                else:
                    if now - self._last >= self._interval:
                        self._emit(self._stage)
                    wait = max(0.05, self._last + self._interval - now)
            if self._closed.wait(wait):
                return


def _progress_interval() -> float:
    """Seconds between progress lines (``ASYNCRL_PROGRESS_INTERVAL_S``, default 15)."""
    raw = os.environ.get(PROGRESS_INTERVAL_VAR, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_PROGRESS_INTERVAL_S
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        logger.warning("%s=%r is not a positive number of seconds: using %g",
                       PROGRESS_INTERVAL_VAR, raw, DEFAULT_PROGRESS_INTERVAL_S)  # fmt: skip
        return DEFAULT_PROGRESS_INTERVAL_S
    return value


@contextmanager
def stage_display(console: Console) -> Iterator[StageProgress]:
    """The run's stages on stderr: rich bars in a terminal; else (output piped or redirected to
    a file, where bars cannot redraw) a progress line per stage at least every interval."""
    if console.is_terminal:
        with _bars(console) as progress:
            yield _stage_progress(progress)
        return

    def write(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    with LineProgress(write, _progress_interval()) as lines:
        yield lines.start


@contextmanager
def run_log_progress() -> Iterator[StageProgress]:
    """Progress lines into the Prefect flow run's own log (the UI's Logs tab), for a run with no
    terminal to draw on: one started from a deployment, or a subflow of an ablation or sweep."""
    from prefect.logging import get_run_logger

    run_logger = get_run_logger()
    with LineProgress(run_logger.info, _progress_interval()) as lines:
        yield lines.start
