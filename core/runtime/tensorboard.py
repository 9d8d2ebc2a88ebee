"""TensorBoard event files for a run's metrics, in ``{run_dir}/tensorboard``.

:class:`TensorBoardSink` gets the rows MLflow's sink gets (same keys, same steps: SFT rows at
step 0..sft.steps-1, RL rows at the step, eval rows at the weight version) and keeps the same
values: None, NaN, inf and non-numbers are dropped (:func:`core.runtime.metrics.finite_numbers`).
Values are stored as TensorBoard scalars (float32). The file is flushed after every row, so
TensorBoard shows a run while it trains and a crash loses no row. A run on a remote fileroot
(``s3://``) writes into its local staging folder (:func:`core.storage.local_path`); the report
stage uploads it beside ``metrics.jsonl``. View with ``tensorboard --logdir <fileroot>``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import Config
from core.runtime.metrics import finite_numbers
from core.storage import join, local_path

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


def tensorboard_url(config: Config) -> str:
    """``{run_dir}/tensorboard``: where the run's event files end up."""
    return join(config.run_dir, "tensorboard")


def tensorboard_dir(config: Config) -> Path:
    """The local folder the event files are written to (a staging folder for a remote run)."""
    return local_path(tensorboard_url(config))


class TensorBoardSink:
    """A :class:`core.runtime.metrics.MetricSink` writing scalars into one TensorBoard log dir.

    The event file is opened at the first row with a number in it (a run that logs nothing leaves
    no file) and flushed after each row; :meth:`close` closes it, and a later row opens a new one.
    Callable from the train-loop thread: calls are serialised by a lock.
    """

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        self._writer: SummaryWriter | None = None
        self._lock = threading.Lock()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        scalars = finite_numbers(metrics)
        if not scalars:
            return
        walltime = time.time()
        with self._lock:
            writer = self._open()
            for key, value in scalars.items():
                writer.add_scalar(key, value, int(step), walltime)
            writer.flush()

    def close(self) -> None:
        """Flush and close the event file (a no-op when none is open)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def _open(self) -> SummaryWriter:
        if self._writer is None:
            # Imported here: it adds ~0.25 s to every import of the pipeline (the CLI's included).
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.logdir))
        return self._writer
