"""Simulated tool latency with a long tail, and a per-call time limit.

Remote tools (search APIs, sandboxes) answer most calls fast and a few very slowly. A call's
latency is drawn from a log-normal given its median and 99th percentile: ``ln L ~ N(mu, sigma)``
with ``mu = ln(median)`` and ``sigma = ln(p99 / median) / z_0.99`` (``z_0.99 = 2.3263``, the
standard normal's 99th percentile). ``p99_s = 0`` means no tail: every call takes the median.
A call still running after ``timeout_s`` is cut off and answered with a timeout error, which
the agent sees like any tool error.

Draws are seeded per episode (:func:`episode_seed`), so a rerun waits the same times and times
out on the same calls.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Z_99 = 2.3263  # standard normal quantile at 0.99


@dataclass(frozen=True)
class LatencySpec:
    """How long a simulated tool call takes (config: tools.latency_s, _p99_s, timeout_s)."""

    median_s: float = 0.0
    p99_s: float = 0.0  # 0 = no tail: every call takes median_s
    timeout_s: float = 0.0  # a call longer than this returns a timeout error; 0 = no limit

    def __post_init__(self) -> None:
        if self.median_s < 0 or self.p99_s < 0 or self.timeout_s < 0:
            raise ValueError(f"latencies must be >= 0, got {self}")
        if self.p99_s and not 0 < self.median_s <= self.p99_s:
            raise ValueError(f"a tail needs 0 < median_s <= p99_s, got {self}")

    @property
    def sigma(self) -> float:
        """The log-normal's sigma; 0 without a tail."""
        return math.log(self.p99_s / self.median_s) / Z_99 if self.p99_s else 0.0

    def draw(self, rng: random.Random) -> float:
        """One call's latency in seconds."""
        if not self.sigma:
            return self.median_s
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))


def episode_seed(sample: dict[str, Any]) -> str:
    """What seeds an episode's latency draws: its ``seed`` (set by the rollout and the eval),
    else its id."""
    return f"tool-latency-{sample.get('seed', sample.get('id'))}"


class ToolClock:
    """Runs an episode's tool calls with drawn latencies and the per-call time limit."""

    def __init__(self, spec: LatencySpec, seed: int | str) -> None:
        self.spec = spec
        self.rng = random.Random(seed)
        self.n_calls = 0
        self.n_timeouts = 0
        self.waited_s = 0.0  # drawn latency, capped at the limit

    async def call(self, name: str, tool: Callable[[], str | Awaitable[str]]) -> str:
        """``tool()``'s result (awaited when it is a coroutine) after the drawn latency, or a
        timeout error past the limit."""
        latency = self.spec.draw(self.rng)
        self.n_calls += 1

        async def slow() -> str:
            if latency:
                await asyncio.sleep(latency)
            result = tool()
            return await result if inspect.isawaitable(result) else result

        limit = self.spec.timeout_s or None
        try:
            result = await asyncio.wait_for(slow(), limit)
        except TimeoutError:
            self.n_timeouts += 1
            self.waited_s += self.spec.timeout_s
            return f"error: {name} timed out after {self.spec.timeout_s:g} s; try again"
        self.waited_s += latency
        return result
