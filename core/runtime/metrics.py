"""Where the train loop sends its numbers. ``core`` knows only this small interface; the Prefect
tasks bind an MLflow sink to it (``tasks/``), the pipeline ``metrics.jsonl`` and TensorBoard's
(:mod:`core.runtime.tensorboard`), tests a list."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol


class MetricSink(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...


def finite_numbers(metrics: Mapping[str, object]) -> dict[str, float]:
    """The values that are finite numbers, as floats; None, NaN, inf, bools and the rest dropped.

    What the MLflow and TensorBoard sinks record (``metrics.jsonl`` keeps the rest as null).
    """
    return {
        key: float(value)
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


class MemorySink:
    """Keeps every logged row (the summary and tests read it)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append({"step": step, **metrics})

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(int(r["step"]), r[key]) for r in self.rows if key in r]


class JsonlSink:
    """One JSON line per ``log_metrics`` call, appended to a local file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        clean = {
            k: (v if isinstance(v, int | float) and math.isfinite(v) else None)
            for k, v in metrics.items()
        }
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")


class FanOut:
    """Send every row to several sinks."""

    def __init__(self, sinks: Iterable[MetricSink]) -> None:
        self.sinks = list(sinks)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log_metrics(metrics, step)
