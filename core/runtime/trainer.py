"""The RL train loop: one loop for every algorithm preset, synchronous (η = 0) or asynchronous.

It is ``experiments/reference_grpo.py``'s loop (synchronous GRPO in one file, tested equal to
this one at η = 0) with the machinery around it. Each step has the reference's four phases:

1. **rollout**: ``prepare_batch`` takes a batch of groups within the staleness bound from the
   rollout worker, which keeps generating in its own process while the learner trains (with
   η = 0 it admits exactly one batch per version: synchronous RL);
2. **batch**: the groups padded into one batch, with the critic's values and the reference
   log-probs where the preset needs them (the learner ranks);
3. **advantages**: ``with_advantages`` (core/runtime/advantages.py), the reference's entry point;
4. **policy step**: proximal log-probs and ``ppo_n_minibatches`` updates on the learner ranks
   (core/runtime/learner_worker.py); the version goes up by one;

then the new weights are published to the engines (:class:`~core.runtime.publisher.Publisher`),
the step's numbers recorded (:func:`~core.runtime.metrics.step_metrics`), and an eval and a
checkpoint taken when due (:class:`~core.runtime.recovery.Recovery` says what a checkpoint
records and how a run resumes). The learner's *busy fraction* (time training / wall time) is the
honest measure of overlap.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.algorithms import kl_penalty, masked_mean
from core.config import Config
from core.models import load_tokenizer
from core.rollout.api import Group
from core.runtime.advantages import with_advantages
from core.runtime.checkpointing import CheckpointManager, checkpoint_url
from core.runtime.fleet import ServerFleet, launch_fleet, launches_servers, with_servers
from core.runtime.handles import LearnerHandle, RolloutHandle
from core.runtime.metrics import (
    MetricSink,
    StepTimes,
    agent_metrics,
    interrupted_episodes,
    mismatch_metrics,
    rollout_metrics,
    staleness,
    step_metrics,
)
from core.runtime.placement import start_learners, start_rollout
from core.runtime.publisher import Publisher
from core.runtime.recovery import Recovery
from core.runtime.timeline import StepRecord, Timeline
from core.storage import join, local_path, upload_dir, write_json
from core.training import TrainBatch, budget_lengths, collate
from core.training.mismatch import ROW_FIELD

logger = logging.getLogger(__name__)

# (version, held-out accuracy) after each eval; may raise to stop the run (Optuna pruning).
EvalCallback = Callable[[int, float], None]


@dataclass
class RLResult:
    """What the RL stage leaves behind."""

    final_model_dir: str
    version: int
    steps_run: int
    checkpoint_url: str
    evals: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    rollout_stats: dict[str, Any] = field(default_factory=dict)


def to_batch(groups: list[Group], pad_id: int) -> TrainBatch:
    """Groups → one padded batch; each group's trajectories stay consecutive. Row fields
    ``group`` and ``episode`` number each row's group and episode across the batch (an episode
    may be several rows: ``agent.trajectory_mode=per_turn``)."""
    rows = [t for g in groups for t in g.trajectories]
    batch = collate(rows, pad_id)
    group_ids, episode_ids, first = [], [], 0
    for index, g in enumerate(groups):
        group_ids += [index] * len(g.trajectories)
        episode_ids += [first + e for e in g.episode_of]
        first += g.n_episodes
    return batch.with_fields(
        group=torch.tensor(group_ids),
        episode=torch.tensor(episode_ids),
        budget_lengths=budget_lengths(rows, batch.width),
        **{ROW_FIELD: torch.arange(len(rows))},  # the mismatch check names rows by it
    )


class Trainer:
    """Owns the rollout worker and the learner group for one RL stage."""

    def __init__(
        self,
        config: Config,
        model_dir: str | Path,
        train: list[dict],
        test: list[dict],
        sink: MetricSink,
        on_step: Callable[[int], None] | None = None,
        on_eval: EvalCallback | None = None,
    ) -> None:
        self.config = config
        self.model_dir = str(model_dir)
        self.train = train
        self.test = test[: config.eval.n_problems or len(test)]
        self.train_probe = train[: config.eval.n_train_problems]
        self.sink = sink
        self.on_step = on_step
        self.on_eval = on_eval
        self.ckpt = CheckpointManager(checkpoint_url(config), config.checkpoint.keep_last)
        self.publisher = Publisher(config)
        self.pad_id = load_tokenizer(config.model.tokenizer_path or model_dir).pad_token_id
        self.evals: list[dict[str, Any]] = []
        self._started = time.perf_counter()
        self._saved = 0  # the version of the last committed checkpoint
        self._rollout_state: dict[str, Any] | None = None  # for a checkpoint on a signal
        self.timeline = Timeline()
        self.batches_path = local_path(join(config.run_dir, "batches.jsonl"))
        self.batches_path.parent.mkdir(parents=True, exist_ok=True)
        self.recovery = Recovery(config, self.ckpt, self.model_dir, self.batches_path)

    # ------------------------------------------------------------------ the loop
    def run(self) -> RLResult:
        cfg, publisher = self.config, self.publisher
        resume = self.recovery.resume()
        start, self.evals = resume.version, resume.evals
        # The learner starts from the run's initial policy, which stays its KL reference; on
        # resume the checkpoint then restores the trained policy (and optimiser) over it.
        learners = start_learners(cfg, publisher.share(self.model_dir, "start"))
        rollout = fleet = None
        try:
            if start:
                learners.load_checkpoint(join(self.ckpt.path(start), "learner"))
            rollout_cfg = cfg
            start_url = publisher.upload(Path(resume.init_dir), start)
            if launches_servers(cfg):  # the run's own servers, from its starting weights
                fleet = launch_fleet(
                    cfg, start_url or resume.init_dir, start,
                    weights_roots=publisher.weights_roots,
                    log_dir=local_path(join(cfg.run_dir, "servers")),
                )  # fmt: skip
                rollout_cfg = with_servers(cfg, fleet.addresses)
                publisher.fleet = fleet
            if cfg.scheduler.type == "ray":
                self._write_placement(learners, fleet)
            rollout = start_rollout(
                rollout_cfg, start_url or resume.init_dir, self.train, version=start,
                state=resume.rollout_state, weights_url=start_url,
            )  # fmt: skip
            if cfg.inference.weight_sync == "distributed":
                publisher.open_broadcast(
                    learners, rollout, len(rollout_cfg.inference.server_addresses)
                )
            version = start
            if not self.evals and cfg.eval.at_start:
                self._evaluate(rollout, version)  # the starting point, same engine and settings
            totals = {
                "samples": 0,
                "tokens": 0,
                "train_s": 0.0,
                "wait_s": 0.0,
                "publish_s": 0.0,
                "step_s": 0.0,
                "wall_s": 0.0,
            }
            run_started = self._started = time.perf_counter()
            self.timeline.pauses.clear()  # the starting eval ran before the RL clock: no pause
            self._saved = start
            for step in range(start, cfg.learner.total_steps):
                try:
                    version = self._step(step, learners, rollout, totals)
                except BaseException as stop:
                    if not isinstance(stop, Exception):  # SIGTERM/Ctrl-C, Prefect's signals
                        self._checkpoint_on_signal(learners, rollout, version)
                    raise
                last = step + 1 == cfg.learner.total_steps
                if self._due(cfg.eval.every_n_steps, step) and not last:
                    self._evaluate(rollout, version)
                if self._due(cfg.checkpoint.every_n_steps, step) or last:
                    self._checkpoint(learners, rollout, version)
            totals["wall_s"] = time.perf_counter() - run_started
            if not self.evals or self.evals[-1]["version"] != version:
                self._evaluate(rollout, version)
            final_dir = self._export(learners, version)
            stats = rollout.stats()
            self._write_timeline()
        finally:
            publisher.close()
            if rollout is not None:
                rollout.close()
            if fleet is not None:
                fleet.stop()
            learners.close()
        return RLResult(
            final_model_dir=final_dir,
            version=version,
            steps_run=cfg.learner.total_steps - start,
            checkpoint_url=self.ckpt.url,
            evals=self.evals,
            summary=self._summary(totals),
            rollout_stats=stats,
        )

    def _step(
        self, step: int, learners: LearnerHandle, rollout: RolloutHandle, totals: dict[str, float]
    ) -> int:
        """One step in the reference loop's four phases, then publish and record; the new
        version."""
        cfg, algo = self.config, self.config.algorithm
        if cfg.checkpoint.on_signal and self._rollout_state is None:
            # what a checkpoint at this version records: taken before the batch is drawn
            self._rollout_state = rollout.state_dict()
        engine_before = rollout.stats().get("engine")
        t0 = time.perf_counter()
        # 1. Rollout: a batch of groups within the staleness bound.
        groups: list[Group] = rollout.prepare_batch(cfg.rollout.stall_timeout_s)
        t_wait = time.perf_counter() - t0
        # Before the update: the learner still holds the version a restarted server must serve,
        # and the publish below must not meet a dead member of the weight group.
        self.publisher.restart_dead_servers(learners, rollout, version=step)
        # 2. Batch: padded rows; the critic's values and the reference where the preset uses them.
        batch = to_batch(groups, self.pad_id)
        values = learners.compute_values(batch) if algo.use_critic else None
        ref = learners.compute_ref_logprobs(batch) if algo.kl_in_reward_coef > 0 else None
        # 3. Advantages.
        batch = with_advantages(
            batch, algo, max_new_tokens=cfg.sampling.max_new_tokens, values=values, ref_logprobs=ref
        )
        # 4. Policy step (π_prox, ppo_n_minibatches updates, the critic): version + 1.
        stats = learners.rl_update(batch)
        version = int(stats["version"])
        self._rollout_state = None  # the step's batch is trained: a checkpoint needs a new state
        t_train = time.perf_counter() - t0 - t_wait
        publish_s = self.publisher.publish(learners, rollout, version)
        times = StepTimes(t_wait, t_train, publish_s, time.perf_counter() - t0)
        self._record(step, version, groups, batch, times, t0 - self._started, totals)
        metrics = step_metrics(step, groups, int(batch.loss_mask.sum()), stats, times)
        metrics.update(rollout_metrics(engine_before, rollout.stats(), times.step_s))
        metrics.update(agent_metrics(groups))
        learner_cfg = cfg.learner
        metrics.update(mismatch_metrics(stats, groups, step, tolerance=learner_cfg.mismatch_tolerance,
                                        warn_frac=learner_cfg.mismatch_warn_frac,
                                        kept_kv=cfg.inference.kv_after_update == "keep"))  # fmt: skip
        if ref is not None:  # the KL that the reward paid, per token, against the reference
            kl = kl_penalty(batch.behaviour_logprobs, ref, algo.kl_estimator)
            metrics["reward/kl_in_reward"] = float(masked_mean(kl, batch.loss_mask))
        self.sink.log_metrics(metrics, step)
        logger.info(
            "step %d: reward %.3f, staleness %.2f/%d, wait %.2fs train %.2fs publish %.2fs",
            step,
            metrics["reward/mean"],
            metrics["staleness/mean"],
            int(metrics["staleness/max"]),
            t_wait,
            t_train,
            publish_s,
        )
        if self.on_step is not None:
            self.on_step(1)
        return version

    # ------------------------------------------------------------------ pieces
    def _record(
        self,
        step: int,
        version: int,
        groups: list[Group],
        batch: TrainBatch,
        times: StepTimes,
        at_s: float,
        totals: dict[str, float],
    ) -> None:
        """The step (begun ``at_s`` into the run) into the run's totals, ``batches.jsonl`` and the
        timeline."""
        lags = staleness(groups, step)
        n_episodes = sum(len(g.rewards) for g in groups)
        totals["samples"] += n_episodes
        totals["tokens"] += int(batch.loss_mask.sum())
        totals["train_s"] += times.train_s
        totals["wait_s"] += times.wait_s
        totals["step_s"] += times.step_s
        totals["publish_s"] += times.publish_s
        self._log_batch(step, version, groups, lags)
        self.timeline.steps.append(
            StepRecord(step, version, at_s, times.wait_s, times.train_s, times.publish_s,
                       float(np.mean(lags)), int(max(lags)), interrupted_episodes(groups),
                       n_episodes)
        )  # fmt: skip

    def _log_batch(
        self, step: int, version: int, groups: list[Group], staleness: list[int]
    ) -> None:
        """``batches.jsonl``: which prompts each step trained on (for audits and resume checks)."""
        row = {
            "step": step,
            "version": version,
            "sample_ids": [g.sample_id for g in groups],
            "staleness": staleness,
            "rewards": [g.rewards for g in groups],
        }
        with self.batches_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def _write_placement(self, learners: LearnerHandle, fleet: ServerFleet | None) -> None:
        """``placement.json``: the Ray node of each learner rank and server (for operators)."""
        placement = {
            "learners": learners.node_ids(),
            "servers": fleet.placement if fleet is not None else [],
        }
        write_json(join(self.config.run_dir, "placement.json"), placement)
        logger.info("placement: %s", placement)

    def _evaluate(self, rollout: RolloutHandle, version: int) -> None:
        t0 = time.perf_counter()
        result = rollout.evaluate(self.test)
        if self.train_probe:
            probe = rollout.evaluate(self.train_probe)
            result.update(train_accuracy=probe["accuracy"], train_n=probe["n"])
        # elapsed_s: RL wall time when this eval started; rl_s: the same without the earlier eval
        # and checkpoint pauses (for time-to-target-accuracy).
        seconds = time.perf_counter() - t0
        result.update(
            version=version,
            seconds=seconds,
            elapsed_s=t0 - self._started,
            rl_s=t0 - self._started - self.timeline.paused_s,
        )
        self.timeline.pause("eval", t0 - self._started, seconds)
        self.evals.append(result)
        extra = {**result["metrics"], **result["sampled"]}  # the task's own; pass@k, mean@k
        metrics = {
            "eval/accuracy": result["accuracy"],
            "eval/timed_out": result["timed_out"],
            **{f"eval/{k}": v for k, v in extra.items()},
        }
        if "train_accuracy" in result:
            metrics["eval/train_accuracy"] = result["train_accuracy"]
        self.sink.log_metrics(metrics, version)
        logger.info(
            "eval at version %d: accuracy %.3f (n=%d)", version, result["accuracy"], result["n"]
        )
        if self.on_eval is not None:
            self.on_eval(version, result["accuracy"])

    def _checkpoint(
        self,
        learners: LearnerHandle,
        rollout: RolloutHandle,
        version: int,
        rollout_state: dict[str, Any] | None = None,
    ) -> None:
        t0 = time.perf_counter()
        path = self.ckpt.path(version)
        self.ckpt.begin(version)
        learners.save_checkpoint(join(path, "learner"))
        self.publisher.write_hf(learners, version, join(path, "hf"))
        state = rollout_state if rollout_state is not None else rollout.state_dict()
        self.ckpt.commit(version, self.recovery.record(version, state, self.evals))
        self._saved = version
        self.timeline.pause("checkpoint", t0 - self._started, time.perf_counter() - t0)

    def _checkpoint_on_signal(
        self, learners: LearnerHandle, rollout: RolloutHandle, version: int
    ) -> None:
        """``checkpoint.on_signal``: the run is stopping on a signal; keep its progress.

        The signal interrupted the driver's wait, never the learner ranks' work (they run on
        their own threads or processes): the step's learner call is let finish first. If the
        learner took no update in this step, the checkpoint is the step's starting version with
        the rollout state taken before its batch was drawn (the rollout worker, perhaps still in
        the interrupted ``prepare_batch``, is not asked); if it did, the checkpoint is the new
        version with the rollout state as it is now (the batch consumed).
        """
        if not self.config.checkpoint.on_signal:
            return
        try:
            if not learners.wait_idle(timeout_s=300):
                logger.warning(
                    "stopping: the learner is still busy after 300 s; no final checkpoint"
                )
                return
            trained = int(learners.version())
            if trained <= self._saved:
                return
            state = self._rollout_state if trained == version else None
            logger.warning("stopping on a signal: final checkpoint at version %d", trained)
            self._checkpoint(learners, rollout, trained, rollout_state=state)
        except Exception:  # the run is stopping anyway: say so and let the signal win
            logger.exception("the final checkpoint failed")

    def _write_timeline(self) -> None:
        """``timeline.json`` / ``timeline.png`` beside the run (uploaded for a remote run folder)."""
        url = join(self.config.run_dir, "timeline")
        try:
            self.timeline.write(local_path(url))
            upload_dir(local_path(url), url)
        except Exception:  # a plot must never fail a finished run
            logger.exception("could not write the timeline")

    def _export(self, learners: LearnerHandle, version: int) -> str:
        final = join(self.config.run_dir, "final")
        return str(self.publisher.write_hf(learners, version, final))

    @staticmethod
    def _due(every: int, step: int) -> bool:
        return every > 0 and (step + 1) % every == 0

    def _summary(self, totals: dict[str, float]) -> dict[str, float]:
        """Throughput over training steps only (evals and checkpoints excluded, they are optional)."""
        wall = max(totals["step_s"], 1e-9)
        return {
            "samples_per_s": totals["samples"] / wall,
            "tokens_per_s": totals["tokens"] / wall,
            "learner_busy_fraction": totals["train_s"] / wall,
            "rl_wall_s": totals["wall_s"],
            "wait_rollout_s": totals["wait_s"],
            "train_s": totals["train_s"],
            "publish_s": totals["publish_s"],
        }
