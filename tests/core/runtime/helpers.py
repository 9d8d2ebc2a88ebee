"""Reading a run's outputs back, for the tests of the pipeline and the flows."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``logdir``: tag → [(step, value), ...]."""
    events = EventAccumulator(str(logdir), size_guidance={SCALARS: 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()[SCALARS]}
