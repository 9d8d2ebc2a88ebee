"""Process helpers for tests that check what a job leaves running."""

from __future__ import annotations

import psutil


def live_descendants(root: psutil.Process | None = None) -> list[psutil.Process]:
    """``root``'s (default: this process's) descendants that are running, zombies excluded."""
    alive = []
    for child in (root or psutil.Process()).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive
