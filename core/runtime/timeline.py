"""Where an RL run's time goes: the learner's wait / train / publish per step, eval and checkpoint
pauses, weight versions, the staleness of what it consumed, and interrupted episodes.

:class:`Timeline` collects one record per step and per pause (seconds since the RL clock
started) and writes ``timeline.json`` and ``timeline.png`` into the run folder. The picture shows
the asynchrony directly: with η > 0 the learner's waits shrink while the staleness it consumes
rises; with η = 0 every step waits for a whole batch.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

COLOURS = {"wait": "#bbbbbb", "train": "#1f77b4", "publish": "#ff7f0e", "eval": "#2ca02c",
           "checkpoint": "#9467bd"}  # fmt: skip


@dataclass
class StepRecord:
    """One learner step: it started waiting at ``start`` (s), then trained, then published."""

    step: int
    version: int  # the version it produced
    start: float
    wait_s: float
    train_s: float
    publish_s: float
    staleness_mean: float
    staleness_max: int
    interrupted: int  # episodes in the batch whose generation was interrupted by a weight update
    samples: int


@dataclass
class Timeline:
    """The run's records; :meth:`write` saves them as JSON and a PNG."""

    steps: list[StepRecord] = field(default_factory=list)
    pauses: list[dict[str, Any]] = field(default_factory=list)  # {"kind", "start", "seconds"}

    @property
    def paused_s(self) -> float:
        """Seconds of eval and checkpoint pauses so far."""
        return sum(p["seconds"] for p in self.pauses)

    def pause(self, kind: str, start: float, seconds: float) -> None:
        self.pauses.append({"kind": kind, "start": start, "seconds": seconds})

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [asdict(s) for s in self.steps], "pauses": list(self.pauses)}

    def write(self, directory: Path) -> tuple[Path, Path]:
        """``timeline.json`` and ``timeline.png`` in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        data, image = directory / "timeline.json", directory / "timeline.png"
        data.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        plot(self, image)
        return data, image


def plot(timeline: Timeline, path: Path) -> Path:
    """Three panels over wall time: learner activity, versions and staleness, interruptions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lanes, versions, interrupts) = plt.subplots(
        3, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [1.2, 2, 1]}
    )
    for s in timeline.steps:
        parts = [("wait", s.wait_s), ("train", s.train_s), ("publish", s.publish_s)]
        at = s.start
        for kind, seconds in parts:
            lanes.broken_barh([(at, seconds)], (0, 1), color=COLOURS[kind])
            at += seconds
    for p in timeline.pauses:
        lanes.broken_barh([(p["start"], p["seconds"])], (0, 1), color=COLOURS[p["kind"]])
    lanes.set_yticks([])
    lanes.set_ylabel("learner")
    lanes.set_xlim(left=0)
    lanes.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()],
        labels=["waiting for a batch", "training", "publishing weights", "eval", "checkpoint"],
        loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=5, fontsize=8, frameon=False,
    )  # fmt: skip
    ends = [s.start + s.wait_s + s.train_s + s.publish_s for s in timeline.steps]
    versions.step(ends, [s.version for s in timeline.steps], where="post", label="weight version")
    versions.set_ylabel("version")
    stale = versions.twinx()
    stale.scatter([s.start + s.wait_s for s in timeline.steps],
                  [s.staleness_mean for s in timeline.steps], color="#d62728", s=12,
                  label="staleness of the consumed batch (mean)")  # fmt: skip
    stale.set_ylabel("staleness", color="#d62728")
    versions.legend(loc="upper left", fontsize=8)
    stale.legend(loc="lower right", fontsize=8)
    interrupts.bar([s.start + s.wait_s for s in timeline.steps],
                   [s.interrupted for s in timeline.steps], width=0.6, color="#8c564b")  # fmt: skip
    interrupts.set_ylabel("interrupted\nepisodes")
    interrupts.set_xlabel("seconds since RL started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
