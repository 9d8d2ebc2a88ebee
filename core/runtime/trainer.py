"""The RL train loop: one loop for every algorithm preset, synchronous (η = 0) or asynchronous.

Per step (docs/design.md, "The async loop"):

    prepare_batch under η  →  critic values / reference log-probs if the preset needs them
    →  advantages  →  proximal log-probs + ppo_n_minibatches updates (learner ranks)  →  version+1
    →  publish weights (export a HF folder; the engine pauses, aborts in-flight requests, loads,
       resumes)  →  periodic eval and checkpoint

The rollout worker keeps generating in its own process while the learner trains, up to the
staleness bound; with η = 0 it admits exactly one batch per version, which is synchronous RL.
The learner's *busy fraction* (time training / wall time) is the honest measure of overlap.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.algorithms import kl_penalty, masked_mean
from core.config import Config, config_changes, config_hash, run_params
from core.models import load_tokenizer
from core.rollout.api import Group
from core.runtime.advantages import with_advantages
from core.runtime.checkpointing import CheckpointManager
from core.runtime.fleet import ServerFleet, launch_fleet, launches_servers, with_servers
from core.runtime.handles import LearnerHandle, RolloutHandle
from core.runtime.metrics import MetricSink, agent_metrics, mismatch_metrics, rollout_metrics
from core.runtime.placement import start_learners, start_rollout
from core.runtime.timeline import StepRecord, Timeline
from core.runtime.weight_sync import BroadcastSync
from core.storage import (
    download_dir,
    download_file,
    exists,
    is_local,
    join,
    local_path,
    remove_dir,
    upload_dir,
    write_json,
)
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


def checkpoint_url(config: Config) -> str:
    return config.checkpoint.url or join(config.run_dir, "checkpoints")


def to_batch(groups: list[Group], pad_id: int) -> TrainBatch:
    """Groups → one padded batch; each group's trajectories stay consecutive. Row fields
    ``group`` and ``episode`` number each row's group and episode across the batch (an episode
    may be several rows: ``rollout.trajectory_mode=per_turn``)."""
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


def _rng_state() -> dict[str, Any]:
    """The driver's RNG states as JSON-friendly lists."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
        "torch": torch.get_rng_state().tolist(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


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
        self.sink = sink
        self.on_step = on_step
        self.on_eval = on_eval
        self.ckpt = CheckpointManager(checkpoint_url(config), config.checkpoint.keep_last)
        self.publish_root = local_path(join(config.run_dir, "weights"))
        # Servers and Ray nodes may share no disk with the driver: with a remote run folder the
        # starting weights and each published version are uploaded under it and fetched there.
        distributed = config.rollout.engine != "hf" or config.scheduler.type == "ray"
        remote = distributed and not is_local(config.run_dir)
        self.publish_url = join(config.run_dir, "weights") if remote else None
        self._broadcast: BroadcastSync | None = None  # rollout.weight_sync=distributed
        self._fleet: ServerFleet | None = None  # the servers this run launched
        self.pad_id = load_tokenizer(config.model.tokenizer_path or model_dir).pad_token_id
        self.evals: list[dict[str, Any]] = []
        self._started = time.perf_counter()
        self._saved = 0  # the version of the last committed checkpoint
        self._rollout_state: dict[str, Any] | None = None  # for a checkpoint on a signal
        self.timeline = Timeline()
        self.batches_path = local_path(join(config.run_dir, "batches.jsonl"))
        self.batches_path.parent.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ the loop
    def run(self) -> RLResult:
        cfg = self.config
        start, init_dir, rollout_state = self._recover()
        # The learner starts from the run's initial policy, which stays its KL reference; on
        # resume the checkpoint then restores the trained policy (and optimiser) over it.
        learners = start_learners(cfg, self._share(self.model_dir, "start"))
        rollout = fleet = broadcast = None
        try:
            if start:
                learners.load_checkpoint(join(self.ckpt.path(start), "learner"))
            rollout_cfg = cfg
            start_url = self._upload(Path(init_dir), start)
            if launches_servers(cfg):  # the run's own servers, from its starting weights
                fleet = launch_fleet(
                    cfg, start_url or init_dir, start,
                    weights_roots=[self.publish_root, self.publish_url],
                    log_dir=local_path(join(cfg.run_dir, "servers")),
                )  # fmt: skip
                rollout_cfg = with_servers(cfg, fleet.addresses)
                self._fleet = fleet
            if cfg.scheduler.type == "ray":
                self._write_placement(learners, fleet)
            rollout = start_rollout(
                rollout_cfg, start_url or init_dir, self.train, version=start,
                state=rollout_state, weights_url=start_url,
            )  # fmt: skip
            if cfg.rollout.weight_sync == "distributed":
                backend = "nccl" if cfg.cluster.n_gpus_per_node else "gloo"
                n_servers = len(rollout_cfg.rollout.server_addresses)
                broadcast = BroadcastSync(learners, rollout, n_servers, backend)
                broadcast.open()
                self._broadcast = broadcast
            version = start
            if not self.evals:
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
            if broadcast is not None:
                broadcast.close()
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
        cfg, algo = self.config, self.config.algorithm
        if cfg.checkpoint.on_signal and self._rollout_state is None:
            # what a checkpoint at this version records: taken before the batch is drawn
            self._rollout_state = rollout.state_dict()
        engine_before = rollout.stats().get("engine")
        t0 = time.perf_counter()
        groups: list[Group] = rollout.prepare_batch(cfg.rollout.stall_timeout_s)
        t_wait = time.perf_counter() - t0
        # Before the update: the learner still holds the version a restarted server must serve,
        # and the publish below must not meet a dead member of the weight group.
        self._restart_dead_servers(learners, rollout, version=step)
        batch = to_batch(groups, self.pad_id)
        values = learners.compute_values(batch) if algo.use_critic else None
        ref = learners.compute_ref_logprobs(batch) if algo.kl_in_reward_coef > 0 else None
        batch = with_advantages(
            batch, algo, max_new_tokens=cfg.rollout.max_new_tokens, values=values, ref_logprobs=ref
        )
        stats = learners.rl_update(batch)
        version = int(stats["version"])
        self._rollout_state = None  # the step's batch is trained: a checkpoint needs a new state
        t_train = time.perf_counter() - t0 - t_wait
        publish_s = self._publish(learners, rollout, version)
        wall = time.perf_counter() - t0
        staleness = [step - g.oldest_version for g in groups]
        trajectories = [t for g in groups for t in g.trajectories]
        interrupted = sum(  # episodes with a row that a weight update interrupted
            len({e for e, t in zip(g.episode_of, g.trajectories, strict=True)
                 if t.metadata.get("n_resumes", 0) > 0})
            for g in groups
        )  # fmt: skip
        token_versions = [
            v for t in trajectories for v, m in zip(t.versions, t.loss_mask, strict=True) if m
        ]
        n_tokens = int(batch.loss_mask.sum())
        episode_rewards = torch.tensor([r for g in groups for r in g.rewards])
        n_episodes = len(episode_rewards)  # a sample is an episode, however many rows it trains
        totals["samples"] += n_episodes
        totals["tokens"] += n_tokens
        totals["train_s"] += t_train
        totals["wait_s"] += t_wait
        totals["step_s"] += wall
        totals["publish_s"] += publish_s
        metrics = {
            "reward/mean": float(episode_rewards.mean()),
            "reward/accuracy": float((episode_rewards > 0.5).float().mean()),
            "staleness/mean": float(np.mean(staleness)),
            "staleness/max": float(max(staleness)),
            # per generated token (a trajectory resumed after an update mixes versions)
            "staleness/token_mean": step - float(np.mean(token_versions))
            if token_versions
            else 0.0,
            "staleness/interrupted_frac": interrupted / n_episodes,
            "throughput/samples_per_s": n_episodes / wall,
            "throughput/tokens_per_s": n_tokens / wall,
            "time/wait_rollout_s": t_wait,
            "time/train_s": t_train,
            "time/publish_s": publish_s,
            "time/step_s": wall,
            "learner/busy_fraction": t_train / wall,
            "response/mean_tokens": n_tokens / n_episodes,  # per episode
            **{k: v for k, v in stats.items() if k.startswith(("actor/", "critic/"))},
        }
        metrics.update(rollout_metrics(engine_before, rollout.stats(), wall))
        metrics.update(agent_metrics(groups))
        learner_cfg = cfg.learner
        metrics.update(mismatch_metrics(stats, groups, step, tolerance=learner_cfg.mismatch_tolerance,
                                        warn_frac=learner_cfg.mismatch_warn_frac))  # fmt: skip
        if ref is not None:  # the KL that the reward paid, per token, against the reference
            kl = kl_penalty(batch.behaviour_logprobs, ref, algo.kl_estimator)
            metrics["reward/kl_in_reward"] = float(masked_mean(kl, batch.loss_mask))
        self.sink.log_metrics(metrics, step)
        self._log_batch(step, version, groups, staleness)
        self.timeline.steps.append(
            StepRecord(step, version, t0 - self._started, t_wait, t_train, publish_s,
                       float(np.mean(staleness)), int(max(staleness)), interrupted, n_episodes)
        )  # fmt: skip
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

    def _publish(self, learners: LearnerHandle, rollout: RolloutHandle, version: int) -> float:
        """Export the new weights and swap them into the engine(s); returns seconds."""
        t0 = time.perf_counter()
        if self._broadcast is not None:  # no folder: the servers receive the tensors
            self._broadcast.publish(version)
            return time.perf_counter() - t0
        directory = self.publish_root / f"v{version:06d}"
        learners.export(str(directory))
        rollout.update_weights(self._upload(directory, version) or str(directory), version)
        previous = self.publish_root / f"v{version - 1:06d}"
        if previous.exists():  # the engine has loaded the new folder; the old one is done
            shutil.rmtree(previous, ignore_errors=True)
        if self.publish_url:
            remove_dir(join(self.publish_url, f"v{version - 1:06d}"))
        return time.perf_counter() - t0

    def _restart_dead_servers(
        self, learners: LearnerHandle, rollout: RolloutHandle, version: int
    ) -> None:
        """Servers of this run that died are started again from the learner's current policy
        (``version``) and rejoin. Meanwhile their requests went to the others (the client
        resubmits them whole), so no episode is lost or counted twice."""
        dead = self._fleet.dead() if self._fleet is not None else []
        if not dead:
            return
        folder = self.publish_root / f"v{version:06d}"
        if not folder.is_dir():
            learners.export(str(folder))
        source = self._upload(folder, version) or str(folder)
        addresses = self._fleet.restart(dead, source, version)
        if self._broadcast is not None:  # the group had a fixed membership: form it again
            self._broadcast.close()
            self._broadcast.open()
            shutil.rmtree(folder, ignore_errors=True)  # no publish will replace this folder
        rollout.restore_servers(addresses)
        logger.warning("restarted inference server(s) %s at version %d", addresses, version)

    def _write_placement(self, learners: LearnerHandle, fleet: ServerFleet | None) -> None:
        """``placement.json``: the Ray node of each learner rank and server (for operators)."""
        placement = {
            "learners": learners.node_ids(),
            "servers": fleet.placement if fleet is not None else [],
        }
        write_json(join(self.config.run_dir, "placement.json"), placement)
        logger.info("placement: %s", placement)

    def _share(self, directory: str, name: str) -> str:
        """``directory``, or its copy under :attr:`publish_url` (uploaded once) for nodes without
        the driver's disk."""
        if self.publish_url is None:
            return directory
        url = join(self.publish_url, name)
        if not exists(join(url, "config.json")):
            upload_dir(directory, url)
        return url

    def _upload(self, directory: Path, version: int) -> str | None:
        """``directory`` uploaded as ``version`` under :attr:`publish_url`, when servers fetch
        weights from there; its URL (else None: they read local folders)."""
        if self.publish_url is None:
            return None
        url = join(self.publish_url, f"v{version:06d}")
        upload_dir(directory, url)
        return url

    def _evaluate(self, rollout: RolloutHandle, version: int) -> None:
        t0 = time.perf_counter()
        result = rollout.evaluate(self.test)
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
            **{f"eval/{k}": v for k, v in extra.items()},
        }
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
        self._write_hf(learners, version, join(path, "hf"))
        recover = {
            "version": version,
            "rollout": rollout_state if rollout_state is not None else rollout.state_dict(),
            "rng": _rng_state(),
            "config_hash": config_hash(self.config),
            "config": run_params(self.config),
            "evals": self.evals,
        }
        self.ckpt.commit(version, recover)
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

    def _recover(self) -> tuple[int, str, dict[str, Any] | None]:
        """(start version, folder to start the engine from, rollout state) — fresh or resumed.

        Resumes from the newest committed checkpoint that passes :meth:`CheckpointManager.problems`;
        a corrupt newer one is skipped with a warning saying why.
        """
        if self.config.checkpoint.recover != "auto":
            self._truncate_batches(0)
            return 0, self.model_dir, None
        step = None
        for candidate in reversed(self.ckpt.committed_steps()):
            problems = self.ckpt.problems(candidate)
            if not problems:
                step = candidate
                break
            logger.warning(
                "recover=auto: skipping checkpoint %s: %s",
                self.ckpt.path(candidate),
                "; ".join(problems),
            )
        if step is None:
            logger.info(
                "recover=auto: no valid committed checkpoint under %s, starting fresh",
                self.ckpt.url,
            )
            self._truncate_batches(0)
            return 0, self.model_dir, None
        recover = self.ckpt.load_recover(step)
        if recover["config_hash"] != config_hash(self.config):
            changes = config_changes(recover.get("config", {}), self.config)
            logger.warning(
                "resuming %s with a config that differs from the checkpoint's: %s",
                self.ckpt.path(step),
                "; ".join(changes) or "(the checkpoint does not list its config)",
            )
        _set_rng_state(recover["rng"])
        self.evals = list(recover.get("evals", []))
        hf_local = download_dir(join(self.ckpt.path(step), "hf"))
        version = int(recover["version"])
        logger.info("recover=auto: resuming from %s (version %d)", self.ckpt.path(step), version)
        self._truncate_batches(version)
        # The engine starts from the checkpoint's HF export at its version: ours loads it, the
        # run's servers are launched from it, running servers are sent it (RolloutWorker).
        return version, str(hf_local), recover["rollout"]

    def _truncate_batches(self, start: int) -> None:
        """Drop ``batches.jsonl`` rows of steps ≥ ``start``: the resumed run trains them again.

        The file grows locally; a remote run folder's copy (uploaded at the end) is fetched first.
        """
        remote = join(self.config.run_dir, "batches.jsonl")
        if not self.batches_path.exists() and not is_local(remote) and exists(remote):
            download_file(remote, self.batches_path)
        if not self.batches_path.exists():
            return
        lines = self.batches_path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line)["step"] < start]
        if len(kept) < len(lines):
            logger.info(
                "batches.jsonl: dropped %d rows of steps >= %d", len(lines) - len(kept), start
            )
            staging = self.batches_path.with_suffix(".jsonl.tmp")
            staging.write_text("".join(kept))
            staging.replace(self.batches_path)

    def _write_timeline(self) -> None:
        """``timeline.json`` / ``timeline.png`` beside the run (uploaded for a remote run folder)."""
        url = join(self.config.run_dir, "timeline")
        try:
            self.timeline.write(local_path(url))
            upload_dir(local_path(url), url)
        except Exception:  # a plot must never fail a finished run
            logger.exception("could not write the timeline")

    def _export(self, learners: LearnerHandle, version: int) -> str:
        return str(self._write_hf(learners, version, join(self.config.run_dir, "final")))

    def _write_hf(self, learners: LearnerHandle, version: int, url: str) -> Path:
        """The policy at ``version`` as a HF folder at ``url``: a copy of the folder just published
        to the engine when there is one (no second full-state gather), else a fresh export."""
        out = local_path(url)
        published = self.publish_root / f"v{version:06d}"
        if published.is_dir():
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(published, out)
        else:
            learners.export(str(out))
        upload_dir(out, url)  # a no-op for a local url
        return out

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
