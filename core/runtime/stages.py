"""The experiment's stages as plain functions; :mod:`core.runtime.job` runs them in order.

Each stage takes the resolved :class:`~core.config.Config` and what earlier stages returned, and
returns references (URLs, local folders) or small results, so that a runner can call it
directly or wrap it one-to-one (a Prefect task in the experiment flow).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.config import Config, config_hash
from core.data.gsm8k import load_gsm8k
from core.data.synthetic import generate_splits
from core.data.templates import render_prompt
from core.evaluation import EvalResult, eval_settings, evaluate_workflow
from core.models import create_pretrained, is_preset, load_model, load_tokenizer
from core.runtime.metrics import MetricSink
from core.runtime.rollout_worker import build_engine, build_workflow
from core.runtime.trainer import EvalCallback, RLResult, Trainer
from core.storage import exists, join, local_path, read_jsonl, upload_dir, write_jsonl

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]


@dataclass
class PreparedData:
    """Training and held-out samples, and where their files live."""

    train: list[dict]
    test: list[dict]
    train_url: str
    test_url: str
    cached: bool = False  # True when an earlier run with the same data config wrote them


def data_cache_url(config: Config) -> str:
    """``{fileroot}/_cache/data/<hash of the data section>-<seed>``: data depends on nothing else."""
    key = f"{config_hash(config, ('data',))}-{config.experiment.seed}"
    return join(config.cluster.fileroot, "_cache", "data", key)


def prepare_data(config: Config) -> PreparedData:
    """Generate (synthetic) or load (GSM8K) the problems once per data config.

    Written as ``train.jsonl`` and ``test.jsonl`` under :func:`data_cache_url` (test first: a
    reader that finds ``train.jsonl`` finds both); later runs read them back.
    """
    base = data_cache_url(config)
    train_url, test_url = join(base, "train.jsonl"), join(base, "test.jsonl")
    if exists(train_url):
        logger.info("data cache hit: %s", base)
        return PreparedData(read_jsonl(train_url), read_jsonl(test_url), train_url, test_url, True)
    data = config.data
    if data.source == "synthetic":
        seed = config.experiment.seed
        train, test = generate_splits(data.synthetic, data.n_train, data.n_test, seed)
    else:
        train = load_gsm8k(data.gsm8k_path, "train", strict=data.strict, limit=data.n_train or None)
        test = load_gsm8k(data.gsm8k_path, "test", strict=data.strict, limit=data.n_test or None)
    write_jsonl(test_url, test)
    write_jsonl(train_url, train)
    logger.info("prepared %d train / %d test problems (%s)", len(train), len(test), data.source)
    return PreparedData(train, test, train_url, test_url)


def training_texts(samples: list[dict], template: str) -> list[str]:
    """Prompt + solution, the text a model sees in supervised training."""
    return [f"{render_prompt(s['question'], template)}{s['answer']}" for s in samples]


def build_or_load_model(config: Config, data: PreparedData) -> str:
    """A local HF folder with the initial policy: a fresh preset model or the given path/hub id."""
    model = config.model
    if not is_preset(model.path) and Path(model.path).exists():
        return model.path
    url = join(config.run_dir, "model_init")
    target = local_path(url)
    if is_preset(model.path):
        texts = training_texts(data.train, config.data.template)
        create_pretrained(
            model.path, texts, target, vocab_size=model.vocab_size, seed=config.experiment.seed
        )
    else:  # a hub id: fetch it once into the run folder so every process loads the same files
        load_model(model.path, dtype=model.dtype).save_pretrained(str(target))
        load_tokenizer(model.tokenizer_path or model.path).save_pretrained(str(target))
    upload_dir(target, url)  # a no-op for a local fileroot
    return str(target)


def rl_train(
    config: Config,
    model_dir: str,
    data: PreparedData,
    sink: MetricSink,
    on_step: Progress | None = None,
    on_eval: EvalCallback | None = None,
) -> RLResult:
    """Asynchronous RL from ``model_dir`` (resumable with ``checkpoint.recover=auto``)."""
    trainer = Trainer(config, model_dir, data.train, data.test, sink, on_step, on_eval)
    return trainer.run()


def evaluate_model(
    config: Config, model_dir: str, test: list[dict], on_sample: Progress | None = None
) -> EvalResult:
    """Greedy held-out accuracy of the model in ``model_dir``, through the rollout workflow on
    the configured engine (as the RL stage evaluates)."""
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_dir)
    engine = build_engine(config, str(model_dir))
    try:
        return asyncio.run(
            evaluate_workflow(
                engine,
                build_workflow(config, tokenizer),
                test[: config.eval.n_problems or len(test)],
                on_sample=on_sample,
                **eval_settings(config),
            )
        )
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
