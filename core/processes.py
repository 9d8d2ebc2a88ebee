"""Child processes that never outlive their parent (Linux's parent-death signal), and the
environment a block's children inherit."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping

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


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set for the block (a child started in it inherits them),
    then restored: a variable that was unset is removed again."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
