"""No silent wait: every call the driver makes to a worker says what it waits for, and ends.

The job's phases all wait on a worker: the starting and periodic evaluations and RL batches on
the rollout worker; SFT steps, RL updates, checkpoints and weight exports on the learner ranks;
publishing on both. A :class:`Watch` over a typed handle (:func:`core.runtime.handles.typed`)
waits for each call in periods of ``warn_s``, logging after each one what is awaited and for how
long, and raises :class:`PhaseTimeoutError` naming the call and the setting once it has waited
``timeout_s``: the job then unwinds as on any error (workers stopped, the run lock released).

The storage calls of the driver (the run lock, checkpoint markers, summaries) are bounded by
:mod:`core.storage`'s timeouts and logged retries instead, and evaluation episodes by
``eval.episode_timeout_s`` and RL episodes by ``rollout.episode_timeout_s`` inside the worker.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.config import Config

logger = logging.getLogger(__name__)


class PhaseTimeoutError(TimeoutError):
    """A worker call took longer than its watch allows; the message names the call."""


@dataclass(frozen=True)
class Watch:
    """How long the driver waits on one worker's calls, and what it says meanwhile."""

    label: str  # the worker, as log lines name it: "rollout", "learner"
    warn_s: float = 60.0  # log what is awaited after each period this long
    timeout_s: float = 3600.0  # then give up (0 = wait as long as it takes)
    setting: str = "watchdog.timeout_s"  # the config field that sets timeout_s, for the message
    # per-method limits that replace timeout_s (the batch wait has its own), as (seconds, setting)
    limits: Mapping[str, tuple[float, str]] = field(default_factory=dict)
    # methods whose waits the worker reports itself in more detail: no periodic line here
    quiet: frozenset[str] = frozenset()

    def wait(self, method: str, future: cf.Future) -> Any:
        """``future``'s result, logging while it is awaited; PhaseTimeoutError past the limit."""
        timeout_s, setting = self.limits.get(method, (self.timeout_s, self.setting))
        what = f"{self.label}.{method}()"
        started = time.monotonic()
        deadline = started + timeout_s if timeout_s > 0 else None
        while True:
            now = time.monotonic()
            period = self.warn_s if deadline is None else min(self.warn_s, deadline - now)
            try:
                return future.result(timeout=max(0.0, period))
            except cf.TimeoutError:
                now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise PhaseTimeoutError(
                    f"{what} did not answer within {timeout_s:g} s ({setting}): the run stops. "
                    f"Raise {setting} if this phase is slow rather than stuck (0 = no limit)."
                )
            if method not in self.quiet:
                limit = f"limit {timeout_s:g} s, {setting}" if deadline is not None else "no limit"
                logger.warning("waiting for %s: %.0f s so far (%s)", what, now - started, limit)


def rollout_watch(config: Config) -> Watch:
    """The rollout worker's: the batch wait is bounded by rollout.stall_timeout_s, which the
    worker enforces and reports itself; the driver gives up ``warn_s`` later (a wedged worker)."""
    w, r = config.watchdog, config.rollout
    return Watch(
        "rollout", w.warn_s, w.timeout_s,
        limits={"prepare_batch": (r.stall_timeout_s + w.warn_s, "rollout.stall_timeout_s")},
        quiet=frozenset({"prepare_batch"}),
    )  # fmt: skip


def learner_watch(config: Config) -> Watch:
    """The learner ranks' (SFT steps, RL updates, checkpoints, exports, weight broadcasts)."""
    return Watch("learner", config.watchdog.warn_s, config.watchdog.timeout_s)
