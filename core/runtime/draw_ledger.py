"""Which prompts the rollout side drew and has not finished with: what a lossless resume needs.

The rollout worker draws prompts one at a time from a :class:`ResumableDataLoader`. With η ≥ 1
and long generations a prompt may still be generating, or waiting in the ready buffer, after
prompts drawn later were trained. A single loader position cannot checkpoint that: rewinding to
the oldest outstanding draw trains the later, already trained draws a second time; not
rewinding loses the outstanding one.

The ledger numbers draws in stream order. Its state is the loader position from before the
oldest outstanding draw, plus the offsets from there of the draws already *settled*: trained,
or rejected, failed or dropped as stale (an uninterrupted run never draws those again either).
A ledger restored from that state replays the stream from the rewound position and passes over
the settled offsets, so each draw is trained at most once per epoch, and every draw that was
outstanding is drawn again, at the same place in the stream (so with the same sampling seed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.data.dataloader import ResumableDataLoader

logger = logging.getLogger(__name__)

SKIP_KEY = "skip_draws"


@dataclass(frozen=True)
class Draw:
    """One prompt drawn: ``index`` counts draws since the ledger's origin; ``epoch`` and
    ``position`` are the loader's cursor before the draw (its place in the data stream)."""

    index: int
    sample: dict[str, Any]
    epoch: int
    position: int


class DrawLedger:
    """Draws from ``loader``, passing over the ``skip`` offsets (settled before a resume)."""

    def __init__(self, loader: ResumableDataLoader, skip: Iterable[int] = ()) -> None:
        self.loader = loader
        self._skip = {int(offset) for offset in skip}
        if any(offset < 0 for offset in self._skip):
            raise ValueError(f"{SKIP_KEY}: offsets must be >= 0, got {sorted(self._skip)}")
        self._next = 0  # index of the next draw
        self._outstanding: dict[int, dict[str, Any]] = {}  # index -> loader state before it
        self.skipped = 0  # draws passed over since the origin

    @classmethod
    def restore(cls, loader: ResumableDataLoader, state: dict[str, Any] | None) -> DrawLedger:
        """A ledger over ``loader`` continuing from a rollout ``state`` (None: a fresh run).

        A state written before the ledger existed has no skip list: it resumes as it always
        did, at the oldest outstanding draw, and the draws trained after that one are trained
        again.
        """
        if state is None:
            return cls(loader)
        loader.load_state_dict(state["dataloader"])
        skip = state.get(SKIP_KEY)
        if skip is None:
            logger.warning(
                "the checkpoint records no %s (written by an older version): resuming at the "
                "oldest draw outstanding then; prompts drawn after it that were already "
                "trained will be trained again",
                SKIP_KEY,
            )
            return cls(loader)
        ledger = cls(loader, skip)
        if skip:
            logger.info(
                "resume: replaying the prompt stream from epoch %d position %d, passing over "
                "%d draw(s) already trained or discarded",
                loader.epoch,
                loader.position,
                len(skip),
            )
        return ledger

    def draw(self) -> Draw:
        """The next draw not settled before a resume; it is outstanding until :meth:`state_dict`
        no longer finds it live."""
        while True:
            before = self.loader.state_dict()
            sample = self.loader.next_samples(1)[0]
            index = self._next
            self._next += 1
            if index in self._skip:
                self._skip.discard(index)
                self.skipped += 1
                continue
            self._outstanding[index] = before
            return Draw(index, sample, before["epoch"], before["position"])

    def state_dict(self, live: Iterable[int]) -> dict[str, Any]:
        """The resumable state, given the indices of the draws still ``live`` (in flight or
        ready, not consumed): every other draw made so far is settled."""
        keep = set(live)
        self._outstanding = {i: st for i, st in self._outstanding.items() if i in keep}
        if self._outstanding:
            origin = min(self._outstanding)
            loader_state = self._outstanding[origin]
        else:
            origin = self._next
            loader_state = self.loader.state_dict()
        settled = [i - origin for i in range(origin, self._next) if i not in self._outstanding]
        not_reached = sorted(i - origin for i in self._skip)  # settled before an earlier resume
        return {"dataloader": loader_state, SKIP_KEY: settled + not_reached}

    @property
    def outstanding(self) -> list[int]:
        """Indices of the draws not yet known to be settled, oldest first."""
        return sorted(self._outstanding)
