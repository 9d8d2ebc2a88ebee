"""Process-local hooks installed before a flow runs: progress display, intermediate evals.

Flow parameters must be serialisable for the Prefect API, so live objects (a rich progress
display, an Optuna trial's pruning callback) travel here instead of as parameters.
"""

from __future__ import annotations

from collections.abc import Callable

from core.runtime.job import StageProgress

_progress: StageProgress | None = None


def set_progress(progress: StageProgress | None) -> None:
    global _progress
    _progress = progress


def progress_for(stage: str, total: int | None = None) -> Callable[[int], None]:
    """A callback advancing ``stage`` by n units (a no-op without a display)."""
    return _progress(stage, total) if _progress is not None else (lambda n: None)


EvalCallback = Callable[[int, float], None]
_on_eval: EvalCallback | None = None


def set_eval_callback(callback: EvalCallback | None) -> None:
    """``callback(version, accuracy)`` after each held-out eval; may raise to stop the run."""
    global _on_eval
    _on_eval = callback


def eval_callback() -> EvalCallback | None:
    return _on_eval
