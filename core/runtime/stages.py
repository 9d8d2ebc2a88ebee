"""The experiment's stages as plain functions; :mod:`core.runtime.job` runs them in order.

Each stage takes the resolved :class:`~core.config.Config` and what earlier stages returned, and
returns references (URLs, local folders) or small results, so that a runner can call it
directly or wrap it one-to-one (a Prefect task in the experiment flow).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import Config, ConfigError, config_hash
from core.config.loading import lora_target_problem
from core.data.prompting import Prompter, sft_target
from core.data.sources import resolve_source
from core.data.tabular import (
    ColumnError,
)
from core.data.templates import render_prompt
from core.evaluation import EvalResult, eval_settings, evaluate_workflow
from core.models import create_pretrained, is_preset, load_model, load_tokenizer
from core.runtime.metrics import MetricSink
from core.runtime.rollout_worker import build_engine, build_workflow
from core.runtime.trainer import EvalCallback, RLResult, Trainer
from core.storage import (
    exists,
    join,
    local_path,
    read_jsonl,
    read_text,
    upload_dir,
    write_json,
    write_jsonl,
)

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
    notes: dict[str, Any] = field(default_factory=dict)  # what preparation dropped, and why


def data_seed(config: Config) -> int:
    """The seed the problems are generated (or split) with: ``data.seed``, else the experiment's."""
    return config.experiment.seed if config.data.seed is None else config.data.seed


def data_cache_url(config: Config) -> str:
    """``{fileroot}/_cache/data/<hash of the data section>-<seed>[-v<version>]``: data depends on
    nothing else but the source's version (``@data_source(version=...)``, shown from 2 on)."""
    key = f"{config_hash(config, ('data',))}-{data_seed(config)}"
    version = resolve_source(config.data.source).version
    if version > 1:
        key += f"-v{version}"
    return join(config.cluster.fileroot, "_cache", "data", key)


def prepare_data(config: Config) -> PreparedData:
    """Generate (synthetic) or load (GSM8K, any tabular dataset) the problems once per data
    config.

    Written as ``train.jsonl`` and ``test.jsonl`` under :func:`data_cache_url` (test first: a
    reader that finds ``train.jsonl`` finds both), with ``notes.json``; later runs read them back.
    """
    base = data_cache_url(config)
    train_url, test_url = join(base, "train.jsonl"), join(base, "test.jsonl")
    notes_url = join(base, "notes.json")
    if exists(train_url):
        logger.info("data cache hit: %s", base)
        notes = json.loads(read_text(notes_url)) if exists(notes_url) else {}
        train, test = read_jsonl(train_url), read_jsonl(test_url)
        return PreparedData(train, test, train_url, test_url, True, notes)
    data = config.data
    try:
        splits = resolve_source(data.source).fn(data, data_seed(config))
    except ColumnError as err:
        raise ConfigError(str(err)) from None
    train, test, notes = splits.train, splits.test, splits.notes
    write_json(notes_url, notes)
    write_jsonl(test_url, test)
    write_jsonl(train_url, train)
    logger.info("prepared %d train / %d test problems (%s)", len(train), len(test), data.source)
    return PreparedData(train, test, train_url, test_url, notes=notes)


def fit_prompts(config: Config, data: PreparedData, model_dir: str) -> PreparedData:
    """Drop samples whose prompt is longer than ``data.max_prompt_tokens`` (as the model will
    see it: through :class:`~core.data.prompting.Prompter`), counting them per split."""
    limit = config.data.max_prompt_tokens
    if limit <= 0:
        return data
    prompter = Prompter.from_config(
        config, load_tokenizer(config.model.tokenizer_path or model_dir)
    )

    def fits(sample: dict) -> bool:
        return len(prompter.prompt_ids(sample["question"], sample.get("system"))) <= limit

    train = [s for s in data.train if fits(s)]
    test = [s for s in data.test if fits(s)]
    dropped = {"train": len(data.train) - len(train), "test": len(data.test) - len(test)}
    if any(dropped.values()):
        logger.warning(
            "dropped prompts longer than data.max_prompt_tokens=%d: %d of %d train, %d of %d test",
            limit, dropped["train"], len(data.train), dropped["test"], len(data.test),
        )  # fmt: skip
    notes = {**data.notes, "prompts_over_max_tokens_dropped": dropped}
    return dataclasses.replace(data, train=train, test=test, notes=notes)


def training_texts(samples: list[dict], template: str) -> list[str]:
    """Prompt + solution, the text a from-scratch model's tokenizer is trained on (its chat
    format does not exist yet: the ``template`` format's text). A solved conversation
    (``sft_messages``) contributes its turns' text and tool calls as JSON, as they will be
    rendered."""
    return [f"{render_prompt(s['question'], template)}{_solution_text(s)}" for s in samples]


def _solution_text(sample: dict) -> str:
    if sample.get("rl_only"):
        return ""
    if not sample.get("sft_messages"):
        return sft_target(sample)
    parts = []
    for message in sample["sft_messages"]:
        parts.append(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            function = call["function"]
            arguments = function["arguments"]
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            parts.append(json.dumps({"name": function["name"], "arguments": arguments}))
    parts += [json.dumps(tool) for tool in sample.get("tools") or []]  # the system turn's list
    return "\n".join(parts)


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
            model.path, texts, target, vocab_size=model.vocab_size, seed=config.experiment.seed,
            chat=config.data.prompt_format == "chat",
        )  # fmt: skip
    else:  # a hub id: fetch it once into the run folder so every process loads the same files
        load_model(model.path, dtype=model.dtype).save_pretrained(str(target))
        load_tokenizer(model.tokenizer_path or model.path).save_pretrained(str(target))
        problem = lora_target_problem(str(target), model) if model.lora_rank else None
        if problem is not None:  # validate() could not see a hub model's modules
            raise ConfigError(problem)
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
    workflow = build_workflow(config, tokenizer)
    try:
        return asyncio.run(
            evaluate_workflow(
                engine,
                workflow,
                test[: config.eval.n_problems or len(test)],
                on_sample=on_sample,
                **eval_settings(config),
            )
        )
    finally:
        for part in (workflow, engine):
            close = getattr(part, "close", None)
            if close is not None:
                close()
