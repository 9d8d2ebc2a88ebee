"""The main job as a plain function: data → model → SFT warm start → async RL → eval → summary.json."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from core.config import Config, config_hash, to_yaml
from core.runtime.metrics import FanOut, JsonlSink, MemorySink, MetricSink
from core.runtime.sft import sft_warm_start
from core.runtime.stages import build_or_load_model, evaluate_model, prepare_data
from core.runtime.trainer import Trainer
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
        model_dir = timed("sft_s", lambda: sft_warm_start(config, model_dir, data.train, sink, tick))

    summary: dict[str, Any] = {
        "experiment": config.experiment.name,
        "trial": config.experiment.trial,
        "run_dir": config.run_dir,
        "config_hash": config_hash(config),
        "model": config.model.path,
        "algorithm": config.algorithm.name,
        "max_staleness": config.rollout.max_staleness,
        "data": {"source": config.data.source, "n_train": len(data.train), "n_test": len(data.test),
                 "train_url": data.train_url, "test_url": data.test_url},
    }
    if config.actor.total_steps > 0:
        trainer = Trainer(config, model_dir, data.train, data.test, sink, on_step=stage("RL", config.actor.total_steps))
        rl = timed("rl_s", trainer.run)
        summary.update(
            accuracy_before=rl.evals[0]["accuracy"], accuracy_after=rl.evals[-1]["accuracy"],
            evals=rl.evals, steps=rl.steps_run, version=rl.version, final_model_dir=rl.final_model_dir,
            checkpoint_url=rl.checkpoint_url, rollout=rl.rollout_stats, **rl.summary,
        )  # fmt: skip
        staleness = rl.rollout_stats.get("staleness", {})
        n = sum(staleness.values())
        summary["mean_staleness"] = sum(int(k) * v for k, v in staleness.items()) / n if n else 0.0
        summary["max_staleness_seen"] = max((int(k) for k in staleness), default=0)
    else:
        n_eval = min(config.eval.n_problems or len(data.test), len(data.test))
        result = timed("eval_s", lambda: evaluate_model(config, model_dir, data.test, on_batch=stage("evaluate", n_eval)))
        summary.update(accuracy_before=result.accuracy, accuracy_after=None, eval_before=result.to_dict(),
                       steps=0, final_model_dir=str(model_dir), checkpoint_url=None)
    summary.update(model_dir=str(model_dir), wall_seconds=time.perf_counter() - started, timings=timings,
                   sft_final_loss=_last(memory, "sft/loss"))
    for name in ("metrics.jsonl", "batches.jsonl"):  # written locally as they grow
        if local_path(join(config.run_dir, name)).exists():
            upload_file(local_path(join(config.run_dir, name)), join(config.run_dir, name))
    write_json(join(config.run_dir, "summary.json"), summary)
    logger.info("summary written to %s", join(config.run_dir, "summary.json"))
    return summary


def _last(memory: MemorySink, key: str) -> float | None:
    series = memory.series(key)
    return series[-1][1] if series else None
