"""The main job as a plain function: data → model → SFT warm start → async RL → eval → summary.json."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from core.config import Config, config_hash, to_yaml
from core.evaluation import EvalResult
from core.runtime.metrics import FanOut, JsonlSink, MemorySink, MetricSink
from core.runtime.sft import sft_warm_start
from core.runtime.stages import PreparedData, build_or_load_model, evaluate_model, prepare_data
from core.runtime.trainer import RLResult, Trainer
from core.storage import join, local_path, upload_file, write_json, write_text

logger = logging.getLogger(__name__)

# (stage name, total units or None) -> callback advancing that stage by n units
StageProgress = Callable[[str, int | None], Callable[[int], None]]


def run_experiment(
    config: Config, progress: StageProgress | None = None, sink: MetricSink | None = None
) -> dict[str, Any]:
    """Run every configured stage; returns the summary also written to ``{run_dir}/summary.json``."""
    torch.set_num_threads(max(1, config.scheduler.torch_threads))
    started = time.perf_counter()
    write_text(join(config.run_dir, "config.yaml"), to_yaml(config))
    memory = MemorySink()
    sinks: list[MetricSink] = [memory, JsonlSink(local_path(join(config.run_dir, "metrics.jsonl")))]
    sink = FanOut([*sinks, sink] if sink is not None else sinks)
    timings: dict[str, float] = {}

    def stage(name: str, total: int | None = None) -> Callable[[int], None]:
        return progress(name, total) if progress else (lambda n: None)

    def timed(key: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        result = fn()
        timings[key] = time.perf_counter() - t
        return result

    stage("prepare data")
    data = timed("prepare_data_s", lambda: prepare_data(config))
    stage("build model")
    model_dir = timed("build_model_s", lambda: build_or_load_model(config, data))
    if config.sft.enabled and config.sft.steps > 0:
        tick = stage("SFT warm start", config.sft.steps)
        model_dir = timed(
            "sft_s", lambda: sft_warm_start(config, model_dir, data.train, sink, tick)
        )

    rl = eval_result = None
    if config.actor.total_steps > 0:
        trainer = Trainer(
            config,
            model_dir,
            data.train,
            data.test,
            sink,
            on_step=stage("RL", config.actor.total_steps),
        )
        rl = timed("rl_s", trainer.run)
    else:
        n_eval = min(config.eval.n_problems or len(data.test), len(data.test))
        eval_result = timed(
            "eval_s",
            lambda: evaluate_model(
                config, model_dir, data.test, on_batch=stage("evaluate", n_eval)
            ),
        )
    summary = summarize(
        config,
        data,
        str(model_dir),
        rl=rl,
        eval_result=eval_result,
        timings=timings,
        wall_seconds=time.perf_counter() - started,
        sft_final_loss=_last(memory, "sft/loss"),
    )
    finish_run_files(config, summary)
    return summary


def summarize(
    config: Config,
    data: PreparedData,
    model_dir: str,
    *,
    rl: RLResult | None,
    eval_result: EvalResult | None,
    timings: dict[str, float],
    wall_seconds: float,
    sft_final_loss: float | None,
) -> dict[str, Any]:
    """The run's ``summary.json``: where things are and the numbers a reader looks for first."""
    summary: dict[str, Any] = {
        "experiment": config.experiment.name,
        "trial": config.experiment.trial,
        "run_dir": config.run_dir,
        "config_hash": config_hash(config),
        "model": config.model.path,
        "algorithm": config.algorithm.name,
        "max_staleness": config.rollout.max_staleness,
        "data": {
            "source": config.data.source,
            "n_train": len(data.train),
            "n_test": len(data.test),
            "train_url": data.train_url,
            "test_url": data.test_url,
        },
        "model_dir": model_dir,
        "sft_final_loss": sft_final_loss,
        "timings": timings,
        "wall_seconds": wall_seconds,
    }
    if rl is not None:
        summary.update(
            accuracy_before=rl.evals[0]["accuracy"], accuracy_after=rl.evals[-1]["accuracy"],
            evals=rl.evals, steps=rl.steps_run, version=rl.version, final_model_dir=rl.final_model_dir,
            checkpoint_url=rl.checkpoint_url, rollout=rl.rollout_stats, **rl.summary,
        )  # fmt: skip
        staleness = rl.rollout_stats.get("staleness", {})
        n = sum(staleness.values())
        summary["mean_staleness"] = sum(int(k) * v for k, v in staleness.items()) / n if n else 0.0
        summary["max_staleness_seen"] = max((int(k) for k in staleness), default=0)
    elif eval_result is not None:
        summary.update(
            accuracy_before=eval_result.accuracy,
            accuracy_after=None,
            eval_before=eval_result.to_dict(),
            steps=0,
            final_model_dir=model_dir,
            checkpoint_url=None,
        )
    return summary


def finish_run_files(config: Config, summary: dict[str, Any]) -> None:
    """Upload the locally grown logs next to the run (remote fileroot) and write summary.json."""
    for name in ("metrics.jsonl", "batches.jsonl"):  # written locally as they grow
        if local_path(join(config.run_dir, name)).exists():
            upload_file(local_path(join(config.run_dir, name)), join(config.run_dir, name))
    write_json(join(config.run_dir, "summary.json"), summary)
    logger.info("summary written to %s", join(config.run_dir, "summary.json"))


def _last(memory: MemorySink, key: str) -> float | None:
    series = memory.series(key)
    return series[-1][1] if series else None
