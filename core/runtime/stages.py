"""The experiment's stages as plain functions: data → model → (warm start → RL) → eval.

Each stage takes the resolved :class:`~core.config.Config` and returns references (URLs, local
folders) or small results, so a Prefect task can wrap it one-to-one and the CLI can call it
directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from core.config import Config
from core.data.gsm8k import load_gsm8k
from core.data.synthetic import generate_splits
from core.data.templates import render_prompt
from core.evaluation import EvalResult, evaluate
from core.models import create_pretrained, is_preset, load_model, load_tokenizer
from core.rewards.registry import resolve_reward
from core.storage import join, local_path, upload_dir, write_jsonl

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]


@dataclass
class PreparedData:
    """Training and held-out samples, and where copies of them were written."""

    train: list[dict]
    test: list[dict]
    train_url: str
    test_url: str


def prepare_data(config: Config, out_url: str | None = None) -> PreparedData:
    """Generate (synthetic) or load (GSM8K) the problems; write them to ``out_url`` (default
    ``{run_dir}/data``) as ``train.jsonl`` and ``test.jsonl`` (test first: a reader that finds
    ``train.jsonl`` finds both)."""
    data = config.data
    if data.source == "synthetic":
        train, test = generate_splits(
            data.synthetic, data.n_train, data.n_test, config.experiment.seed
        )
    else:
        train = load_gsm8k(data.gsm8k_path, "train", strict=data.strict, limit=data.n_train or None)
        test = load_gsm8k(data.gsm8k_path, "test", strict=data.strict, limit=data.n_test or None)
    base = out_url or join(config.run_dir, "data")
    train_url, test_url = join(base, "train.jsonl"), join(base, "test.jsonl")
    write_jsonl(test_url, test)
    write_jsonl(train_url, train)
    logger.info("prepared %d train / %d test problems (%s)", len(train), len(test), data.source)
    return PreparedData(train, test, train_url, test_url)


def training_texts(samples: list[dict], template: str) -> list[str]:
    """Prompt + solution, the text a model sees in supervised training."""
    return [f"{render_prompt(s['question'], template)}{s['answer']}" for s in samples]


def build_or_load_model(config: Config, data: PreparedData) -> Path:
    """A local HF folder with the initial policy: a fresh preset model or the given path/hub id."""
    model = config.model
    if not is_preset(model.path):
        if Path(model.path).exists():
            return Path(model.path)
        # A hub id: fetch it once into the run folder so every process loads the same files.
        url = join(config.run_dir, "model_init")
        target = local_path(url)
        load_model(model.path, dtype=model.dtype).save_pretrained(str(target))
        load_tokenizer(model.tokenizer_path or model.path).save_pretrained(str(target))
        upload_dir(target, url)
        return target
    url = join(config.run_dir, "model_init")
    target = local_path(url)
    create_pretrained(
        model.path,
        training_texts(data.train, config.data.template),
        target,
        vocab_size=model.vocab_size,
        seed=config.experiment.seed,
    )
    upload_dir(target, url)  # a no-op for a local fileroot
    return target


def evaluate_model(
    config: Config, model_dir: str | Path, test: list[dict], on_batch: Progress | None = None
) -> EvalResult:
    """Greedy held-out accuracy of the model in ``model_dir``."""
    torch.manual_seed(config.experiment.seed)
    model = load_model(
        model_dir, dtype=config.model.dtype, attn_implementation=config.model.attn_implementation
    )
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_dir)
    n = config.eval.n_problems or len(test)
    return evaluate(
        model,
        tokenizer,
        test[:n],
        template=config.data.template,
        reward_fn=resolve_reward(config.rollout.reward_fn),
        max_new_tokens=config.eval.max_new_tokens,
        batch_size=config.eval.batch_size,
        on_batch=on_batch,
    )
