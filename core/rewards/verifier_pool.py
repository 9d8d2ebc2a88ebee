"""Rewards off the event loop: verifier processes with a wall-time limit per call.

A reward that parses LaTeX or runs tests can take seconds, or hang. Called inline it would
stall every episode the rollout event loop is generating. :class:`VerifierPool` keeps
``workers`` subprocesses (``python -m core.rewards.verifier_pool PATH``), each importing the
reward by path once and reading JSON lines; a call is sent to an idle one and awaited without
blocking the loop. A worker exits when its stdin closes, so it never outlives its run. A call that raises, returns a non-number, or runs
past ``timeout_s`` scores 0.0 and is counted (the hung process is killed and replaced).

Config values a reward names as keyword parameters (:func:`reward_settings`: the sandbox policy
of a reward that runs code) are bound to it here, inline and in every verifier process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import subprocess
import sys
from typing import Any

from core.rewards.registry import SafeReward, bind_settings, is_blocking, resolve_reward

logger = logging.getLogger(__name__)


def _serve(path: str, settings: str = "{}") -> None:
    """A verifier process: score JSON lines ``[completion, reference]`` from stdin until EOF,
    answering ``[value, error or null]`` lines on stdout. ``settings``: JSON, see
    :func:`reward_settings`."""
    fn = bind_settings(resolve_reward(path), json.loads(settings))
    reward = SafeReward(fn, name=path, max_warnings=0)
    out = sys.stdout
    sys.stdout = sys.stderr  # a reward that prints must not corrupt the answers
    for line in sys.stdin:
        completion, reference = json.loads(line)
        before = reward.n_failures
        value = reward(completion, reference)
        error = reward.last_error if reward.n_failures > before else None
        out.write(json.dumps([value, error]) + "\n")
        out.flush()


class _Worker:
    """One verifier subprocess (a plain process: a daemonic rollout worker may start these)."""

    def __init__(self, path: str, settings: dict[str, Any] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "core.rewards.verifier_pool", path, json.dumps(settings or {})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C in the terminal goes to the run, not to verifiers
        )

    def score(self, completion: str, reference: str, timeout_s: float) -> tuple[float, str | None]:
        """Blocking: one call; raises TimeoutError past ``timeout_s``."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps([completion, reference]) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError
        line = self.process.stdout.readline()
        if not line:
            raise EOFError(f"verifier exited with {self.process.poll()}")
        value, error = json.loads(line)
        return float(value), error

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class VerifierPool:
    """``await pool(completion, reference)`` → a reward, scored in another process."""

    def __init__(
        self,
        path: str,
        *,
        workers: int = 2,
        timeout_s: float = 10.0,
        settings: dict[str, Any] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"rollout.reward_workers must be >= 1 for a pool, got {workers}")
        resolve_reward(path)  # a bad path fails here, not in every worker
        self.path, self.timeout_s, self.settings = path, timeout_s, settings
        self.n_calls = self.n_failures = self.n_timeouts = 0
        self._workers = [_Worker(path, settings) for _ in range(workers)]
        self._idle: asyncio.Queue[_Worker] | None = None

    async def __call__(self, completion: str, reference: str) -> float:
        if self._idle is None:  # bound to the loop that first uses the pool
            self._idle = asyncio.Queue()
            for worker in self._workers:
                self._idle.put_nowait(worker)
        worker = await self._idle.get()
        self.n_calls += 1
        try:
            value, error = await asyncio.to_thread(
                worker.score, completion, reference, self.timeout_s
            )
        except (TimeoutError, EOFError, OSError) as exc:
            worker = self._replace(worker)
            return self._fail(
                f"ran past {self.timeout_s} s" if isinstance(exc, TimeoutError) else repr(exc),
                timeout=isinstance(exc, TimeoutError),
            )
        finally:
            self._idle.put_nowait(worker)
        if error is not None:
            return self._fail(error)
        return value

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = _Worker(self.path, self.settings)
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def _fail(self, error: str, *, timeout: bool = False) -> float:
        self.n_failures += 1
        self.n_timeouts += int(timeout)
        if self.n_failures <= 5:
            logger.warning("reward %s %s -> 0.0", self.path, error)
        return 0.0

    def stats(self) -> dict[str, Any]:
        return {"calls": self.n_calls, "failures": self.n_failures, "timeouts": self.n_timeouts}

    def close(self) -> None:
        for worker in self._workers:
            worker.kill()


class InlineScorer:
    """The reward called in the caller's thread (fast rewards: GSM8K's regex), or in a worker
    thread when it is marked :func:`~core.rewards.registry.blocking` (code tests)."""

    def __init__(self, reward: SafeReward) -> None:
        self.reward = reward
        self.in_thread = is_blocking(reward.fn)

    async def __call__(self, completion: str, reference: str) -> float:
        if self.in_thread:
            return await asyncio.to_thread(self.reward, completion, reference)
        return self.reward(completion, reference)

    def stats(self) -> dict[str, Any]:
        return {"calls": self.reward.n_calls, "failures": self.reward.n_failures, "timeouts": 0}

    def close(self) -> None:
        pass


Scorer = InlineScorer | VerifierPool


def make_scorer(
    reward_fn: Any,
    *,
    workers: int = 0,
    timeout_s: float = 10.0,
    settings: dict[str, Any] | None = None,
) -> Scorer:
    """``rollout.reward_workers`` > 0 and an import path: a :class:`VerifierPool`; else inline.
    ``settings`` are bound to a reward that names them (:func:`reward_settings`)."""
    if workers > 0 and isinstance(reward_fn, str):
        return VerifierPool(reward_fn, workers=workers, timeout_s=timeout_s, settings=settings)
    if isinstance(reward_fn, str):
        fn = bind_settings(resolve_reward(reward_fn), settings)
        return InlineScorer(SafeReward(fn, name=reward_fn))
    return InlineScorer(SafeReward(bind_settings(reward_fn, settings)))


def reward_settings(config: Any) -> dict[str, Any]:
    """Config values a reward function gets when it names them as keyword parameters:
    ``sandbox`` (``tools.sandbox``) and ``sandbox_timeout_s`` (``tools.timeout_s``),
    for rewards that run model-written code (:mod:`core.rewards.code`)."""
    t = config.tools
    return {"sandbox": t.sandbox, "sandbox_timeout_s": t.timeout_s}


def scorer_from_config(config: Any) -> Scorer:
    """The scorer of a :class:`core.config.Config`'s ``rollout.reward_fn`` / ``reward_workers``."""
    r = config.rollout
    return make_scorer(
        r.reward_fn,
        workers=r.reward_workers,
        timeout_s=r.reward_timeout_s,
        settings=reward_settings(config),
    )


if __name__ == "__main__":
    _serve(*sys.argv[1:3])
