"""The main job as a plain function: run the stages in order and write ``summary.json``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from core.config import Config, config_hash, to_yaml
from core.runtime.stages import build_or_load_model, evaluate_model, prepare_data
from core.storage import join, write_json, write_text

logger = logging.getLogger(__name__)

# (stage name, total units or None) -> callback advancing that stage by n units
StageProgress = Callable[[str, int | None], Callable[[int], None]]


def run_experiment(config: Config, progress: StageProgress | None = None) -> dict[str, Any]:
    """data → model → eval; returns the summary that is also written to ``{run_dir}/summary.json``."""
    torch.set_num_threads(max(1, config.scheduler.torch_threads))
    started = time.perf_counter()
    write_text(join(config.run_dir, "config.yaml"), to_yaml(config))
    timings: dict[str, float] = {}

    def stage(name: str, total: int | None = None) -> Callable[[int], None]:
        return progress(name, total) if progress else (lambda n: None)

    t = time.perf_counter()
    stage("prepare data")
    data = prepare_data(config)
    timings["prepare_data_s"] = time.perf_counter() - t

    t = time.perf_counter()
    stage("build model")
    model_dir = build_or_load_model(config, data)
    timings["build_model_s"] = time.perf_counter() - t

    t = time.perf_counter()
    n_eval = min(config.eval.n_problems or len(data.test), len(data.test))
    before = evaluate_model(config, model_dir, data.test, on_batch=stage("evaluate", n_eval))
    timings["eval_s"] = time.perf_counter() - t

    summary: dict[str, Any] = {
        "experiment": config.experiment.name,
        "trial": config.experiment.trial,
        "run_dir": config.run_dir,
        "config_hash": config_hash(config),
        "model": config.model.path,
        "model_dir": str(model_dir),
        "algorithm": config.algorithm.name,
        "max_staleness": config.rollout.max_staleness,
        "data": {"source": config.data.source, "n_train": len(data.train), "n_test": len(data.test),
                 "train_url": data.train_url, "test_url": data.test_url},
        "accuracy_before": before.accuracy,
        "accuracy_after": None,
        "eval_before": before.to_dict(),
        "steps": 0,
        "wall_seconds": time.perf_counter() - started,
        "timings": timings,
    }
    write_json(join(config.run_dir, "summary.json"), summary)
    logger.info("summary written to %s", join(config.run_dir, "summary.json"))
    return summary
