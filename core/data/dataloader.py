"""An endless, exactly resumable batch loader over an in-memory list of samples.

The order within epoch ``e`` is a permutation drawn from ``random.Random(f"{seed}-{epoch}")``,
so it depends only on (seed, epoch): the whole stream is a pure function of the seed, and a
checkpoint only needs (epoch, position) to continue it exactly. Both whole batches
(``next_batch``, the trainer) and single samples (``next_samples``, the rollout executor that
submits prompts one at a time) advance the same cursor.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

_STATE_KEYS = ("epoch", "position", "seed", "batch_size", "dataset_len", "shuffle", "drop_last")


class ResumableDataLoader:
    """Yield batches (lists of samples) forever, reshuffling every epoch.

    With ``drop_last=True`` a batch never straddles epochs: when fewer than ``batch_size``
    samples are left in the epoch they are skipped. With ``drop_last=False`` the epoch's last
    batch is shorter instead. ``next_samples(k)`` draws single samples and does cross epoch
    boundaries, since a one-at-a-time consumer leaves no remainder to drop.
    """

    def __init__(
        self,
        dataset: Sequence[dict],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if len(dataset) == 0:
            raise ValueError("dataset is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > len(dataset):
            # Every batch would be dropped and next_batch would never return.
            raise ValueError(
                f"batch_size ({batch_size}) exceeds dataset length ({len(dataset)}) "
                "with drop_last=True"
            )
        self._dataset = dataset
        self._batch_size = batch_size
        self._shuffle = shuffle
        self._seed = seed
        self._drop_last = drop_last
        self._epoch = 0
        self._position = 0
        self._order = self._order_for(0)

    # -- cursor -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Index of the epoch the cursor is in (0-based)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Samples consumed (or dropped) so far in the current epoch."""
        return self._position

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def batches_per_epoch(self) -> int:
        n, b = len(self._dataset), self._batch_size
        return n // b if self._drop_last else -(-n // b)

    def _order_for(self, epoch: int) -> list[int]:
        order = list(range(len(self._dataset)))
        if self._shuffle:
            # A string seed is hashed deterministically (unlike hash()), across processes too.
            random.Random(f"{self._seed}-{epoch}").shuffle(order)
        return order

    def _start_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self._position = 0
        self._order = self._order_for(epoch)

    def _take(self, k: int) -> list[dict]:
        indices = self._order[self._position : self._position + k]
        self._position += len(indices)
        return [self._dataset[i] for i in indices]

    # -- drawing ------------------------------------------------------------------------------

    def next_batch(self) -> list[dict]:
        """The next batch; ``batch_size`` samples unless ``drop_last=False`` ends an epoch."""
        remaining = len(self._order) - self._position
        if remaining == 0 or (self._drop_last and remaining < self._batch_size):
            self._start_epoch(self._epoch + 1)
        return self._take(self._batch_size)

    def next_samples(self, k: int) -> list[dict]:
        """The next ``k`` samples, continuing into following epochs as needed."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        out: list[dict] = []
        while len(out) < k:
            if self._position == len(self._order):
                self._start_epoch(self._epoch + 1)
            out.extend(self._take(k - len(out)))
        return out

    def __iter__(self) -> Iterator[list[dict]]:
        while True:
            yield self.next_batch()

    # -- checkpointing ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable cursor; ``load_state_dict`` continues the stream exactly."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self._seed,
            "batch_size": self._batch_size,
            "dataset_len": len(self._dataset),
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a cursor saved by :meth:`state_dict` on a loader over the same dataset.

        The saved seed is adopted (the stream is defined by it); dataset length, batch size,
        shuffle and drop_last must match, or ValueError names the field.
        """
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"loader state is missing {missing}")
        current = self.state_dict()
        for key in ("dataset_len", "batch_size", "shuffle", "drop_last"):
            if state[key] != current[key]:
                raise ValueError(
                    f"loader state mismatch: {key} is {state[key]!r} in the checkpoint "
                    f"but {current[key]!r} here"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0:
            raise ValueError(f"loader state: epoch must be >= 0, got {epoch}")
        if not 0 <= position <= len(self._dataset):
            raise ValueError(
                f"loader state: position must be in [0, {len(self._dataset)}], got {position}"
            )
        if state["seed"] != self._seed:
            logger.info("Loader seed %s replaced by checkpoint seed %s", self._seed, state["seed"])
        self._seed = state["seed"]
        self._start_epoch(epoch)
        self._position = position
