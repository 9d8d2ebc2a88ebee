"""Child processes that never outlive their parent (Linux's parent-death signal)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets SIGTERM when ``parent``
    dies, even by ``kill -9`` (Linux; ``None`` elsewhere). The signal follows the *thread* that
    started the child: start it from one that lives as long as the child should."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the line above
            os._exit(1)

    return arm
