"""The experiment's stages as Prefect tasks (one per DAG node of ``flows/experiment.py``).

Each task calls the plain ``core`` stage and returns references: data URLs, model folders,
summaries. Retries only where re-running is harmless (data preparation, model building).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from core.config import Config, config_hash
from core.runtime.job import finish_run_files, summarize
from core.runtime.metrics import MetricSink
from core.runtime.sft import sft_warm_start
from core.runtime.stages import PreparedData, build_or_load_model, evaluate_model, prepare_data
from core.runtime.trainer import Trainer
from core.storage import exists, join, read_jsonl
from tasks.hooks import eval_callback, progress_for

logger = logging.getLogger(__name__)


@dataclass
class DataRef:
    """Where a prepared dataset lives (what tasks pass instead of the rows)."""

    train_url: str
    test_url: str
    cache_key: str
    cached: bool

    def load(self) -> PreparedData:
        return PreparedData(
            read_jsonl(self.train_url), read_jsonl(self.test_url), self.train_url, self.test_url
        )


def data_cache_key(config: Config) -> str:
    """Data depends only on the data section and the seed."""
    return f"{config_hash(config, ('data',))}-{config.experiment.seed}"


@task(name="prepare_data", retries=2, retry_delay_seconds=2, cache_policy=NONE)
def prepare_data_task(config: Config) -> DataRef:
    """Generate or load the problems once per data config: later runs reuse the cached files."""
    key = data_cache_key(config)
    base = join(config.cluster.fileroot, "_cache", "data", key)
    train_url, test_url = join(base, "train.jsonl"), join(base, "test.jsonl")
    if exists(train_url):  # written last, so the pair is complete
        logger.info("data cache hit: %s", base)
        return DataRef(train_url, test_url, key, cached=True)
    prepare_data(config, out_url=base)
    return DataRef(train_url, test_url, key, cached=False)


@task(name="build_or_load_model", retries=1, cache_policy=NONE)
def build_model_task(config: Config, data: DataRef) -> str:
    return str(build_or_load_model(config, data.load()))


@task(name="sft_warm_start", cache_policy=NONE)
def sft_task(config: Config, model_dir: str, data: DataRef, sink: MetricSink) -> str:
    tick = progress_for("SFT warm start", config.sft.steps)
    return str(sft_warm_start(config, model_dir, data.load().train, sink, tick))


@task(name="rl_train", cache_policy=NONE)
def rl_task(config: Config, model_dir: str, data: DataRef, sink: MetricSink) -> dict[str, Any]:
    """Async RL; resumable (checkpoint.recover=auto), so a failed run is re-run, not retried."""
    prepared = data.load()
    trainer = Trainer(
        config,
        model_dir,
        prepared.train,
        prepared.test,
        sink,
        on_step=progress_for("RL", config.actor.total_steps),
        on_eval=eval_callback(),
    )
    return asdict(trainer.run())


@task(name="evaluate", cache_policy=NONE)
def evaluate_task(config: Config, model_dir: str, data: DataRef) -> dict[str, Any]:
    test = data.load().test
    n = min(config.eval.n_problems or len(test), len(test))
    return evaluate_model(
        config, Path(model_dir), test, on_batch=progress_for("evaluate", n)
    ).to_dict()


@task(name="report", cache_policy=NONE)
def report_task(
    config: Config,
    data: DataRef,
    model_dir: str,
    rl: dict[str, Any] | None,
    evaluation: dict[str, Any] | None,
    timings: dict[str, float],
    started: float,
    sft_final_loss: float | None,
    ids: dict[str, str],
) -> dict[str, Any]:
    """summary.json next to the run (the same summary the plain core job writes)."""
    from core.evaluation import EvalResult
    from core.runtime.trainer import RLResult

    summary = summarize(
        config,
        data.load(),
        model_dir,
        rl=RLResult(**rl) if rl is not None else None,
        eval_result=EvalResult(**evaluation) if evaluation is not None else None,
        timings=timings,
        wall_seconds=time.perf_counter() - started,
        sft_final_loss=sft_final_loss,
    )
    summary.update(ids)
    finish_run_files(config, summary)
    return summary
