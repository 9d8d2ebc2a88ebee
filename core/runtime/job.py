"""The experiment pipeline — the one place the stage order lives::

    prepare_data → [prepare_pairs] → build_model → [fit_prompts] → sft_warm_start
        → [reward_model] → [evaluate_start → dpo] → rl_train (or evaluate) → report

:class:`Pipeline` runs the stages of :mod:`core.runtime.stages`. *How* each stage runs is a hook,
a :class:`StageRunner`: :func:`call_stage` calls it (``asyncrl run --plain``, benchmarks, tests);
the experiment flow passes one that runs it as a Prefect task (``tasks.stages.prefect_stage``).
Metrics go to ``metrics.jsonl``, to TensorBoard's ``tensorboard/`` (``tracking.tensorboard``) and to
any extra sinks (the flow adds MLflow's); the summary goes to ``summary.json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

from core.config import Config, config_hash, stamp_trial, to_yaml
from core.evaluation import EvalResult
from core.redaction import redact
from core.runtime.dpo import dpo_train
from core.runtime.metrics import FanOut, JsonlSink, MemorySink, MetricSink
from core.runtime.preference import PreferenceResult, needs_pairs, prepare_pairs
from core.runtime.reward_model import reward_model_train
from core.runtime.run_lock import lock_run
from core.runtime.sft import sft_warm_start
from core.runtime.stage_resume import stage_result
from core.runtime.stages import (
    PreparedData,
    build_or_load_model,
    evaluate_model,
    fit_prompts,
    prepare_data,
    rl_train,
)
from core.runtime.tensorboard import TensorBoardSink, tensorboard_dir, tensorboard_url
from core.runtime.trainer import EvalCallback, RLResult
from core.storage import join, local_path, upload_dir, upload_file, write_json, write_text

logger = logging.getLogger(__name__)
T = TypeVar("T")

# (stage name, total units or None) -> callback advancing that stage by n units
StageProgress = Callable[[str, int | None], Callable[[int], None]]


class StageRunner(Protocol):
    """Runs one stage: ``runner(name, fn, *args)`` returns ``fn(*args)``, however it gets there."""

    def __call__(self, name: str, fn: Callable[..., T], /, *args: Any) -> T: ...


def call_stage(name: str, fn: Callable[..., T], /, *args: Any) -> T:
    """The plain runner: call the stage."""
    return fn(*args)


@dataclass
class Pipeline:
    """One experiment's stages, in order, with the hooks that observe them."""

    config: Config
    run_stage: StageRunner = call_stage
    sinks: Sequence[MetricSink] = ()  # extra metric sinks (MLflow's in the flow)
    progress: StageProgress | None = None
    on_eval: EvalCallback | None = None  # (version, accuracy) after each held-out eval
    lock: bool = True  # hold the run folder's lock during run() (False: the caller holds it)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    dpo: PreferenceResult | None = None  # set by warm_start when dpo.enabled
    reward_model: PreferenceResult | None = None  # ... when reward_model.enabled
    start_eval: EvalResult | None = None  # the task eval before DPO (dpo.eval_start)

    def __post_init__(self) -> None:
        stamp_trial(self.config)  # a run without a trial gets a timestamp folder
        path = local_path(join(self.config.run_dir, "metrics.jsonl"))
        self.memory = MemorySink()
        self.tensorboard: TensorBoardSink | None = None
        if self.config.tracking.tensorboard:
            self.tensorboard = TensorBoardSink(tensorboard_dir(self.config))
        own = [self.memory, JsonlSink(path), *([self.tensorboard] if self.tensorboard else [])]
        self.sink = FanOut([*own, *self.sinks])

    def run(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every stage; returns the summary (with ``extra`` added) also written to summary.json.

        The run folder is locked for the whole run: a second job on it fails at once. The
        TensorBoard file is closed at the end, whether the run succeeded or failed.
        """
        if not self.lock:
            return self._run(extra)
        with lock_run(self.config):
            return self._run(extra)

    def close(self) -> None:
        """Close the TensorBoard event file (:meth:`run` does; a :meth:`warm_start` caller may)."""
        if self.tensorboard is not None:
            self.tensorboard.close()

    def _run(self, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        try:
            return self._run_stages(extra)
        finally:
            self.close()

    def _run_stages(self, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        cfg = self.config
        torch.set_num_threads(max(1, cfg.scheduler.torch_threads))
        started = time.perf_counter()
        write_text(join(cfg.run_dir, "config.yaml"), to_yaml(cfg, redacted=True))
        data, model_dir = self.warm_start()
        rl = evaluation = None
        if cfg.learner.total_steps > 0:
            ticks = self._ticks("rl_train", cfg.learner.total_steps)
            rl = self._stage(
                "rl_train", rl_train, cfg, model_dir, data, self.sink, ticks, self.on_eval
            )
        else:
            n = min(cfg.eval.n_problems or len(data.test), len(data.test))
            ticks = self._ticks("evaluate", n)
            evaluation = self._stage("evaluate", evaluate_model, cfg, model_dir, data.test, ticks)
        sft_loss = [loss for _, loss in self.memory.series("sft/loss")]
        if not sft_loss and cfg.sft.enabled:  # reused from an earlier attempt (recover=auto)
            sft_loss = [(stage_result(cfg, "sft") or {}).get("final_loss")]
        facts = {
            "timings": dict(self.timings),  # up to the report
            "wall_seconds": time.perf_counter() - started,
            "sft_final_loss": sft_loss[-1] if sft_loss else None,
            **self._preference_facts(evaluation),
            **(extra or {}),
        }
        return self._stage("report", report, cfg, data, model_dir, rl, evaluation, facts)

    def _preference_facts(self, evaluation: EvalResult | None) -> dict[str, Any]:
        """The summary's DPO and reward-model entries; without RL, accuracy before/after spans
        the DPO stage."""
        facts: dict[str, Any] = {}
        if self.reward_model is not None:
            facts["reward_model"] = self.reward_model.summary()
            facts["reward_model_accuracy_before"] = self.reward_model.before["accuracy"]
            facts["reward_model_accuracy_after"] = self.reward_model.after["accuracy"]
        if self.dpo is None:
            return facts
        facts |= {
            "dpo": self.dpo.summary(),
            "preference_accuracy_before": self.dpo.before["preference_accuracy"],
            "preference_accuracy_after": self.dpo.after["preference_accuracy"],
        }
        if evaluation is not None and self.start_eval is not None:
            facts["accuracy_before"] = self.start_eval.accuracy
            facts["accuracy_after"] = evaluation.accuracy
            facts["eval_start"] = self.start_eval.to_dict()
        return facts

    def warm_start(self) -> tuple[PreparedData, str]:
        """The stages before RL: data, the initial model, its SFT warm start and DPO (each if
        enabled)."""
        cfg = self.config
        self._ticks("prepare_data")
        data = self._stage("prepare_data", prepare_data, cfg)
        pairs = None
        if needs_pairs(cfg):  # read and checked before any model is built
            self._ticks("prepare_pairs")
            pairs = self._stage("prepare_pairs", prepare_pairs, cfg, data)
        self._ticks("build_model")
        model_dir = self._stage("build_model", build_or_load_model, cfg, data)
        if cfg.data.max_prompt_tokens > 0:
            self._ticks("fit_prompts")
            data = self._stage("fit_prompts", fit_prompts, cfg, data, model_dir)
        if cfg.sft.enabled and cfg.sft.steps > 0:
            ticks = self._ticks("sft_warm_start", cfg.sft.copy_drill_steps + cfg.sft.steps)
            model_dir = self._stage(
                "sft_warm_start", sft_warm_start, cfg, model_dir, data.train, self.sink, ticks
            )
        if pairs is not None and cfg.reward_model.enabled:
            ticks = self._ticks("reward_model", cfg.reward_model.steps)
            self.reward_model = self._stage(
                "reward_model", reward_model_train, cfg, model_dir, pairs, self.sink, ticks
            )
        if pairs is not None and cfg.dpo.enabled:
            if cfg.dpo.eval_start:
                n = min(cfg.eval.n_problems or len(data.test), len(data.test))
                ticks = self._ticks("evaluate_start", n)
                self.start_eval = self._stage(
                    "evaluate_start", evaluate_model, cfg, model_dir, data.test, ticks
                )
            ticks = self._ticks("dpo", cfg.dpo.steps)
            self.dpo = self._stage("dpo", dpo_train, cfg, model_dir, pairs, self.sink, ticks)
            model_dir = self.dpo.model_dir
        return data, str(model_dir)

    def _stage(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        started = time.perf_counter()
        result = self.run_stage(name, fn, *args)
        self.timings[f"{name}_s"] = time.perf_counter() - started
        return result

    def _ticks(self, name: str, total: int | None = None) -> Callable[[int], None] | None:
        return self.progress(name, total) if self.progress is not None else None


def run_experiment(config: Config, **hooks: Any) -> dict[str, Any]:
    """Run every stage of ``config`` (see :class:`Pipeline` for the hooks); returns the summary."""
    return Pipeline(config, **hooks).run()


def report(
    config: Config,
    data: PreparedData,
    model_dir: str,
    rl: RLResult | None,
    evaluation: EvalResult | None,
    facts: Mapping[str, Any],
) -> dict[str, Any]:
    """The run's ``summary.json`` (next to the run, with the locally grown logs uploaded)."""
    summary = summarize(config, data, model_dir, rl=rl, evaluation=evaluation)
    summary.update(facts)
    for name in ("metrics.jsonl", "batches.jsonl"):  # written locally as they grow
        if local_path(join(config.run_dir, name)).exists():
            upload_file(local_path(join(config.run_dir, name)), join(config.run_dir, name))
    if tensorboard_dir(config).is_dir():  # flushed at every row: complete here
        upload_dir(tensorboard_dir(config), tensorboard_url(config))
    write_json(join(config.run_dir, "summary.json"), redact(summary))
    logger.info("summary written to %s", join(config.run_dir, "summary.json"))
    return summary


def trained_by(summary: dict[str, Any]) -> str:
    """What a summary's ``accuracy_before`` / ``accuracy_after`` span: ``RL``, or ``DPO`` for a
    DPO run without RL steps."""
    return "DPO" if summary.get("dpo") and not summary.get("steps") else "RL"


def starting_eval(evals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluation of the starting policy (version 0), or None when eval.at_start=false."""
    return next((e for e in evals if e["version"] == 0), None)


def summarize(
    config: Config,
    data: PreparedData,
    model_dir: str,
    *,
    rl: RLResult | None,
    evaluation: EvalResult | None,
) -> dict[str, Any]:
    """Where things are and the numbers a reader looks for first."""
    summary: dict[str, Any] = {
        "experiment": config.experiment.name,
        "trial": config.experiment.trial,
        "run_dir": config.run_dir,
        "config_hash": config_hash(config),
        "model": config.model.path,
        "algorithm": config.method,
        "max_staleness": config.rollout.max_staleness,
        "data": {
            "source": config.data.source,
            "n_train": len(data.train),
            "n_test": len(data.test),
            "train_url": data.train_url,
            "test_url": data.test_url,
            **data.notes,
        },
        "model_dir": model_dir,
    }
    if rl is not None:
        staleness = rl.rollout_stats.get("staleness", {})
        n = sum(staleness.values())
        start = starting_eval(rl.evals)
        summary.update(
            accuracy_before=None if start is None else start["accuracy"],
            accuracy_after=rl.evals[-1]["accuracy"],
            evals=rl.evals,
            steps=rl.steps_run,
            version=rl.version,
            final_model_dir=rl.final_model_dir,
            checkpoint_url=rl.checkpoint_url,
            rollout=rl.rollout_stats,
            mean_staleness=sum(int(k) * v for k, v in staleness.items()) / n if n else 0.0,
            max_staleness_seen=max((int(k) for k in staleness), default=0),
            **rl.summary,
        )
    elif evaluation is not None:
        summary.update(
            accuracy_before=evaluation.accuracy,
            accuracy_after=None,
            eval_before=evaluation.to_dict(),
            steps=0,
            final_model_dir=model_dir,
            checkpoint_url=None,
        )
    return summary
