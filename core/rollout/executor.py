"""The staleness-bounded rollout executor (AReaL's asynchronous rollout controller).

Groups of episodes run concurrently in the background while the learner trains. With batch size
``B`` (groups per training step), staleness bound ``η`` and learner version ``v``, a new group may
start only while

    accepted + running < (η + v + 1) · B     and     running < max_concurrent_groups

(AReaL, arXiv 2505.24298, §4). η = 0 admits exactly one batch per version: synchronous RL.

With ``adaptive_staleness`` the submission bound uses a working window ``w ≤ η`` in place of η
(ours, not AReaL's). When generation outpaces the learner, admitting up to η only makes every
batch η versions old at no gain in throughput: the learner never waits either way. So ``w``
starts at 1 (the least that overlaps generation with training), grows by one after a batch the
learner had to wait for, and shrinks by one after a batch that found a whole spare batch ready.
The η filter on consumed groups is unchanged.

Counter rules, after the bugs in AReaL's own tracker: a rejected or failed group leaves
``running`` and never enters ``accepted`` (#567: otherwise ``prepare_batch`` stalls); a group
found too stale when the batch is cut is dropped and leaves ``accepted`` too; after recovery
``accepted`` restarts at ``v · B`` (#1388). Limits are per executor, never divided again (#1396).

Groups can finish out of order, so the submission bound alone does not guarantee the consumed
staleness; ``prepare_batch`` therefore takes the oldest groups first and drops any whose oldest
token is more than η versions behind, which makes "never older than η" a hard guarantee.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.inference.api import InferenceEngine, request_priority
from core.rollout.api import Group, Trajectory, Workflow, episode_rows, episode_sample

logger = logging.getLogger(__name__)

SampleSource = Callable[[], dict[str, Any]]
GroupFilter = Callable[[Group], bool]


class RolloutError(RuntimeError):
    """The rollout side cannot go on (too many failing episodes)."""


class EpisodeTimeoutError(TimeoutError):
    """An episode ran past its time limit (a hung tool or environment) and was cancelled."""


@dataclass
class RolloutCounters:
    """What the executor has done; the invariants are asserted in tests."""

    submitted: int = 0  # groups started
    running: int = 0  # groups in flight
    accepted: int = 0  # groups complete and kept (consumed ones included), minus stale drops
    consumed: int = 0  # groups handed to the learner
    rejected: int = 0  # groups with a rejected episode or refused by the group filter
    filtered: int = 0  # of those, refused by the group filter (DAPO's dynamic sampling)
    filtered_in_a_row: int = 0  # groups refused by the filter since the last accepted one
    failed: int = 0  # groups whose workflow raised
    dropped_stale: int = 0  # groups older than η when the batch was cut
    window: int = 0  # the submission bound in use (η, or adaptive_staleness's working window)
    episodes_failed: int = 0
    episodes_timed_out: int = 0  # of those, cancelled past the episode time limit
    staleness: Counter = field(default_factory=Counter)  # consumed groups by staleness

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "staleness"},
            "staleness": dict(sorted(self.staleness.items())),
        }


class RolloutExecutor:
    """Runs ``group_size`` episodes per prompt under the staleness bound, in the background."""

    def __init__(
        self,
        engine: InferenceEngine,
        workflow: Workflow,
        *,
        batch_size: int,
        group_size: int,
        max_staleness: int,
        max_concurrent: int,
        max_failure_rate: float = 0.2,
        min_episodes_for_failure_rate: int = 16,
        group_filter: GroupFilter | None = None,
        max_filtered_in_a_row: int = 256,
        adaptive_staleness: bool = False,
        episode_timeout_s: float | None = None,
    ) -> None:
        if batch_size <= 0 or group_size <= 0:
            raise ValueError("rollout.batch_size and algorithm.group_size must be > 0")
        if max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {max_staleness}")
        self.engine = engine
        self.workflow = workflow
        self.batch_size = batch_size
        self.group_size = group_size
        self.max_staleness = max_staleness
        # Concurrency is configured in episodes; the executor schedules whole groups.
        self.max_concurrent_groups = max(1, max_concurrent // group_size)
        self.max_failure_rate = max_failure_rate
        self.min_episodes_for_failure_rate = min_episodes_for_failure_rate
        self.group_filter = group_filter
        self.max_filtered_in_a_row = max_filtered_in_a_row
        self.adaptive_staleness = adaptive_staleness
        self.episode_timeout_s = episode_timeout_s or None  # 0 = no limit
        self.counters = RolloutCounters(
            window=min(1, max_staleness) if adaptive_staleness else max_staleness
        )
        self.version = 0  # the learner's version, as last published
        self._first_cut = True  # the next batch is the first of this run (or since recovery)
        self._ready: list[Group] = []
        self._tasks: dict[asyncio.Task, dict[str, Any]] = {}  # in-flight group -> its sample
        self._paused = False
        self._error: BaseException | None = None
        self._wakeup = asyncio.Event()  # capacity may have opened: the submitter looks again
        self._changed = (
            asyncio.Event()
        )  # a group finished or the version moved: prepare_batch looks again
        self._submitter: asyncio.Task | None = None
        self._episodes_done = 0

    # ---------------------------------------------------------------- capacity
    def capacity(self) -> int:
        """How many more groups may start now (0 while paused)."""
        if self._paused:
            return 0
        c = self.counters
        by_staleness = (c.window + self.version + 1) * self.batch_size - (c.accepted + c.running)
        return max(0, min(self.max_concurrent_groups - c.running, by_staleness))

    # ---------------------------------------------------------------- lifecycle
    def start(self, next_sample: SampleSource) -> None:
        """Start submitting in the background; ``next_sample()`` draws the next prompt."""
        if self._submitter is not None:
            return
        self._submitter = asyncio.create_task(
            self._submit_loop(next_sample), name="rollout-submitter"
        )

    async def stop(self) -> None:
        """Cancel the submitter and every in-flight group."""
        tasks = [t for t in [self._submitter, *self._tasks] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._submitter = None
        self._tasks.clear()

    def pause(self) -> None:
        """Stop starting new groups (in-flight ones go on; the engine aborts/resumes them)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._poke()

    def set_version(self, version: int) -> None:
        """The learner published ``version``: more capacity opens up."""
        self.version = version
        self._poke()

    def recover(self, version: int, counters: dict[str, Any] | None = None) -> None:
        """Restart after a checkpoint: ``accepted`` restarts at ``v · B`` (AReaL #1388).

        The groups in flight or ready at the checkpoint are gone: the rollout worker draws
        their prompts again and they are counted when started again. So nothing is running,
        ``accepted`` is what was consumed, and ``submitted`` only counts finished groups, which
        keeps ``submitted == accepted + dropped_stale + rejected + failed + running``.
        """
        self.version = version
        if counters:
            for key, value in counters.items():
                if key == "staleness":
                    self.counters.staleness = Counter({int(k): v for k, v in value.items()})
                elif hasattr(self.counters, key):
                    setattr(self.counters, key, value)
        self.counters.running = 0
        low = min(1, self.max_staleness) if self.adaptive_staleness else self.max_staleness
        self.counters.window = min(max(self.counters.window, low), self.max_staleness)
        self._first_cut = True
        c = self.counters
        c.accepted = c.consumed = version * self.batch_size
        c.submitted = c.accepted + c.dropped_stale + c.rejected + c.failed
        self._ready.clear()

    def outstanding_samples(self) -> list[dict[str, Any]]:
        """Samples drawn but not consumed yet: in flight, or finished and waiting in the buffer."""
        in_flight = [sample for task, sample in self._tasks.items() if not task.done()]
        return in_flight + [group.sample for group in self._ready]

    # ---------------------------------------------------------------- batches
    async def prepare_batch(
        self, timeout_s: float | None = None, warn_every_s: float | None = None
    ) -> list[Group]:
        """Wait for ``batch_size`` complete groups within the staleness bound, oldest first.

        While it waits, a log line every ``warn_every_s`` says what for (:meth:`waiting_for`);
        after ``timeout_s`` it raises :class:`TimeoutError` with the same.
        """
        started = time.monotonic()
        deadline = None if timeout_s is None else started + timeout_s
        next_warning = None if warn_every_s is None else started + warn_every_s
        waited = False
        while True:
            self._raise_if_failed()
            self._drop_stale()
            if len(self._ready) >= self.batch_size:
                self._adapt_window(waited, spare=len(self._ready) - self.batch_size)
                self._ready.sort(key=lambda g: g.oldest_version)
                batch, self._ready = self._ready[: self.batch_size], self._ready[self.batch_size :]
                for group in batch:
                    self.counters.staleness[self.version - group.oldest_version] += 1
                self.counters.consumed += len(batch)
                return batch
            if self._submitter is None:
                raise RuntimeError(
                    "RolloutExecutor.start(next_sample) must be called before prepare_batch"
                )
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(
                    f"no full batch within {timeout_s:.0f} s (rollout.stall_timeout_s): "
                    f"{self.waiting_for()}"
                )
            if next_warning is not None and warn_every_s is not None and now >= next_warning:
                logger.warning("no batch for %.0f s: %s", now - started, self.waiting_for())
                next_warning = now + warn_every_s
            wake = min((t for t in (deadline, next_warning) if t is not None), default=None)
            waited = True
            await self._wait_for_change(None if wake is None else max(0.0, wake - now))

    def _adapt_window(self, waited: bool, spare: int) -> None:
        """adaptive_staleness: one step wider after a wait, one narrower after a spare batch.
        The first batch of a run (or after recovery) always waits and is not counted."""
        c = self.counters
        first, self._first_cut = self._first_cut, False
        if not self.adaptive_staleness or first:
            return
        if waited and c.window < self.max_staleness:
            c.window += 1
        elif not waited and spare >= self.batch_size and c.window > min(1, self.max_staleness):
            c.window -= 1
        else:
            return
        logger.info("adaptive staleness: window %d of η=%d", c.window, self.max_staleness)
        self._poke()

    def waiting_for(self) -> str:
        """What a waiting ``prepare_batch`` waits for, in one line (for stall logs and errors)."""
        c = self.counters
        return (
            f"{len(self._ready)}/{self.batch_size} groups ready, {c.running} running "
            f"(capacity {self.capacity()}, paused={self._paused}), learner version "
            f"{self.version}, engine version {self.engine.version}, η={self.max_staleness} "
            f"(window {c.window}); "
            f"so far {c.submitted} submitted, {c.accepted} accepted, {c.rejected} rejected "
            f"({c.filtered} by the group filter, {c.filtered_in_a_row} in a row), "
            f"{c.failed} failed, {c.dropped_stale} dropped as stale"
        )

    def _drop_stale(self) -> None:
        fresh = [g for g in self._ready if self.version - g.oldest_version <= self.max_staleness]
        dropped = len(self._ready) - len(fresh)
        if dropped:
            logger.info("dropping %d group(s) older than η=%d", dropped, self.max_staleness)
            self.counters.dropped_stale += dropped
            self.counters.accepted -= dropped  # their slots open up again
            self._ready = fresh
            self._poke()

    # ---------------------------------------------------------------- internals
    async def _submit_loop(self, next_sample: SampleSource) -> None:
        while True:
            if self.engine.version + self.max_staleness < self.version:
                # Everything generated now would be dropped as stale: fail loudly, don't spin.
                self._error = RolloutError(
                    f"the engine serves version {self.engine.version} but the learner is at "
                    f"{self.version} (η={self.max_staleness}): publish weights to the engine first"
                )
                self._poke()
                return
            for _ in range(self.capacity()):
                sample = next_sample()
                self.counters.submitted += 1
                self.counters.running += 1
                task = asyncio.create_task(
                    self._run_group(sample, self.version, self.counters.submitted)
                )
                self._tasks[task] = sample
                task.add_done_callback(lambda t: self._tasks.pop(t, None))
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _run_group(self, sample: dict[str, Any], version: int, order: int) -> None:
        # the engine serves older groups' calls first when it has more than it can batch
        request_priority.set(order)  # this task's context: its episodes' requests inherit it
        started = time.monotonic()
        episodes = [self._episode(episode_sample(sample, i)) for i in range(self.group_size)]
        results = await asyncio.gather(*episodes, return_exceptions=True)
        self.counters.running -= 1
        self._episodes_done += len(results)
        errors = [r for r in results if isinstance(r, BaseException)]
        if any(isinstance(e, asyncio.CancelledError) for e in errors):
            return
        self.counters.episodes_timed_out += sum(isinstance(e, EpisodeTimeoutError) for e in errors)
        sample_id = str(sample.get("id", ""))
        episodes: list[list[Trajectory] | None] = []
        if not errors:
            try:
                episodes = [episode_rows(r) for r in results]  # type: ignore[arg-type]
            except ValueError as bad:  # a workflow broke the contract: count it as failed
                errors = [bad]
        if errors:
            self.counters.failed += 1
            self.counters.episodes_failed += len(errors)
            logger.warning("episode failed for sample %s: %r", sample_id, errors[0])
            self._check_failure_rate(errors[0])
        elif any(rows is None for rows in episodes):
            self.counters.rejected += 1
        else:
            group = Group.of_episodes(sample_id, episodes, version, sample=sample)  # type: ignore[arg-type]
            for i, trajectory in zip(group.episode_of, group.trajectories, strict=True):
                trajectory.metadata.update(
                    sample_id=sample_id, group_index=i, group_seconds=time.monotonic() - started
                )
            if self.group_filter is not None and not self.group_filter(group):
                self._filtered(group)
            else:
                self.counters.accepted += 1
                self.counters.filtered_in_a_row = 0
                self._ready.append(group)
        self._poke()

    async def _episode(self, sample: dict[str, Any]) -> Any:
        """One episode, cancelled past ``episode_timeout_s`` (EpisodeTimeoutError)."""
        limit = asyncio.timeout(self.episode_timeout_s)
        try:
            async with limit:
                return await self.workflow.run_episode(self.engine, sample)
        except TimeoutError:
            if not limit.expired():  # the workflow's own timeout, not ours
                raise
            raise EpisodeTimeoutError(
                f"episode ran past rollout.episode_timeout_s={self.episode_timeout_s:g} s and "
                "was cancelled"
            ) from None

    def _filtered(self, group: Group) -> None:
        """A group the filter refused: warn when it keeps happening, stop after the limit."""
        c = self.counters
        c.rejected += 1
        c.filtered += 1
        c.filtered_in_a_row += 1
        if c.filtered_in_a_row % self.batch_size == 0:
            logger.warning(
                "the group filter refused the last %d groups in a row (%d of %d so far; "
                "last rewards %s): dynamic sampling finds no group with differing rewards",
                c.filtered_in_a_row,
                c.filtered,
                c.submitted,
                group.rewards,
            )
        limit = self.max_filtered_in_a_row
        if limit and c.filtered_in_a_row >= limit and self._error is None:
            self._error = RolloutError(
                f"the group filter refused {c.filtered_in_a_row} groups in a row "
                f"(rollout.max_filtered_in_a_row={self.max_filtered_in_a_row}): every group's "
                f"rewards were equal (last: {group.rewards}); check the reward function, or turn "
                "dynamic sampling off (algorithm.dynamic_sampling=false)"
            )

    def _check_failure_rate(self, error: BaseException) -> None:
        if self._episodes_done < self.min_episodes_for_failure_rate:
            return
        rate = self.counters.episodes_failed / self._episodes_done
        if rate > self.max_failure_rate:
            self._error = RolloutError(
                f"{rate:.0%} of episodes failed (rollout.max_failure_rate={self.max_failure_rate}); "
                f"last error: {error!r}"
            )

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
        if (
            self._submitter is not None
            and self._submitter.done()
            and not self._submitter.cancelled()
        ):
            exc = self._submitter.exception()
            if exc is not None:  # e.g. the data source raised
                raise RolloutError(f"rollout submission stopped: {exc!r}") from exc

    def _poke(self) -> None:
        self._wakeup.set()
        self._changed.set()

    async def _wait_for_change(self, timeout: float | None) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=timeout)
        except TimeoutError:
            pass
