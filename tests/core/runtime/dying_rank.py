"""A stand-in learner rank for test_learner_group, test_handles and test_watchdog: a real process that works, or dies mid-call (kept
out of the test module so a spawned rank imports nothing heavy)."""

from __future__ import annotations

import os
import time


class Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def where(self) -> str:
        return f"rank {self.rank} in pid {os.getpid()}"

    def node_id(self) -> str:
        return f"node-{self.rank}"

    def nap(self, seconds: float) -> float:
        time.sleep(seconds)  # a call that takes long, or never answers (test_watchdog)
        return seconds

    def step(self) -> int:
        if self.rank == 1:
            os._exit(9)  # the process dies, as a rank killed by the OOM killer would
        time.sleep(60)  # rank 0 would wait in a collective with the dead rank
        return self.rank
