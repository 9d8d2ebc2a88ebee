"""Process helpers for tests that check what a job leaves running."""

from __future__ import annotations

from multiprocessing import forkserver, resource_tracker

import psutil


def _helpers_of_this_process() -> set[int | None]:
    """Python's forkserver (local actors start from it) and resource tracker: started once,
    they live as long as the process that started them, like a thread pool."""
    return {forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid}


def live_descendants(root: psutil.Process | None = None) -> list[psutil.Process]:
    """``root``'s (default: this process's) descendants that are running, zombies and this
    process's multiprocessing helpers excluded."""
    helpers = _helpers_of_this_process() if root is None else set()
    alive = []
    for child in (root or psutil.Process()).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and child.pid not in helpers:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive
