"""Supervised warm start: the learner's masked NLL on prompt → solution (+ its stop token), or
on the assistant turns of a solved agent conversation (rows with ``sft_messages``)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from core.config import Config
from core.data.copy_drills import build_drills
from core.data.dataloader import ResumableDataLoader
from core.data.prompting import Prompter, sft_target
from core.models import load_tokenizer
from core.models.tokenizer import number_tokens
from core.rollout.api import Trajectory
from core.runtime.metrics import MetricSink
from core.runtime.placement import start_learners
from core.runtime.stage_resume import finished_stage, mark_finished
from core.storage import join, local_path, upload_dir
from core.training import collate

logger = logging.getLogger(__name__)


def sft_example(prompt_ids: list[int], target: list[int]) -> Trajectory:
    """Loss on the target only — the solution and its stop token (the model learns to answer,
    not to ask)."""
    n_prompt = len(prompt_ids)
    return Trajectory(
        input_ids=prompt_ids + target,
        loss_mask=[0] * n_prompt + [1] * len(target),
        logprobs=[0.0] * (n_prompt + len(target)),
        versions=[-1] * (n_prompt + len(target)),
        reward=0.0,
        prompt_len=n_prompt,
    )


def conversation_example(ids: list[int], mask: list[int]) -> Trajectory:
    """A solved agent episode: loss on the assistant turns only (see Prompter.conversation_ids)."""
    n = len(ids)
    return Trajectory(ids, mask, [0.0] * n, [-1] * n, reward=0.0, prompt_len=mask.index(1))


def sft_rows(train: list[dict]) -> list[dict]:
    """The training rows SFT learns from: all but RL-only ones (``"rl_only": true``: a prompt
    RL should meet that has no solution to imitate, e.g. core/workflows/support_data.py)."""
    return [row for row in train if not row.get("rl_only")]


def _example(prompter: Prompter, row: dict) -> Trajectory:
    """A row's SFT example: its solved conversation (``sft_messages`` after the opening, with
    the row's ``tools``) when it has one, else prompt → target."""
    if row.get("sft_messages"):
        messages = prompter.opening(row["question"], row.get("system")) + row["sft_messages"]
        return conversation_example(*prompter.conversation_ids(messages, row.get("tools")))
    return sft_example(
        prompter.prompt_ids(row["question"], row.get("system")),
        prompter.target_ids(sft_target(row)),
    )


def sft_warm_start(
    config: Config,
    model_dir: str | Path,
    train: list[dict],
    sink: MetricSink,
    on_step: Callable[[int], None] | None = None,
) -> Path:
    """Run ``sft.steps`` optimizer steps; returns the local HF folder of the warm-started model
    (under ``recover=auto``, the one this run already trained: core/runtime/stage_resume.py)."""
    done = finished_stage(config, "sft")
    if done is not None:
        return Path(done[0])
    sft = config.sft
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_dir)
    prompter = Prompter.from_config(config, tokenizer)
    examples = [_example(prompter, row) for row in sft_rows(train)]
    if sft.copy_drill_steps > 0:
        model_dir = copy_drills(config, model_dir, examples, tokenizer, sink, on_step)
    loader = ResumableDataLoader(
        examples, batch_size=sft.batch_size, shuffle=True, seed=config.experiment.seed
    )
    learners = start_learners(config, str(model_dir), mode="sft")
    started, loss = time.perf_counter(), None
    try:
        for step in range(sft.steps):
            batch = collate(loader.next_batch(), tokenizer.pad_token_id)
            stats = learners.sft_step(batch)
            sink.log_metrics(
                {
                    "sft/loss": stats["loss"],
                    "sft/lr": stats["lr"],
                    "sft/grad_norm": stats["grad_norm"],
                    "sft/tokens_per_s": stats["tokens"] / max(stats["seconds"], 1e-9),
                },
                step,
            )
            loss = stats["loss"]
            if on_step is not None:
                on_step(1)
        url = join(config.run_dir, "sft")
        out = local_path(url)
        learners.export(str(out))
        upload_dir(out, url)
    finally:
        learners.close()
    seconds = time.perf_counter() - started
    mark_finished(config, "sft", {"steps": sft.steps, "seconds": seconds, "final_loss": loss})
    logger.info("SFT: %d steps in %.1f s", sft.steps, seconds)
    return out


def copy_drills(
    config: Config,
    model_dir: str | Path,
    examples: list[Trajectory],
    tokenizer: PreTrainedTokenizerBase,
    sink: MetricSink,
    on_step: Callable[[int], None] | None = None,
) -> Path:
    """``sft.copy_drill_steps`` steps of copy drills (core/data/copy_drills.py) drawn from the
    SFT examples, with a learning-rate schedule of their own (one per phase: the first
    ``sft.copy_drill_first_steps`` drill first turns only); returns the drilled model's local
    folder, where the SFT steps start."""
    sft = config.sft
    drills = build_drills(
        [(e.input_ids, e.loss_mask) for e in examples],
        sft.copy_drill_window,
        digits=number_tokens(tokenizer),
        which=sft.copy_drill_turns,
        first_share=sft.copy_drill_first_share,
    )
    logger.info("copy drills: %d excerpts, %d names", len(drills.drills), len(drills.pool))
    rng = random.Random(config.experiment.seed)
    # The first-turn phase and the rest each get a learning-rate schedule of their own, as two
    # drill runs one after the other (the chain whose copies formed, docs/tutorials/own-agent.md).
    # When the first copy forms still varies with the seed, with one schedule or two.
    phases = [
        (sft.copy_drill_first_steps, True),
        (sft.copy_drill_steps - sft.copy_drill_first_steps, False),
    ]
    phases = [phase for phase in phases if phase[0] > 0]
    step, loss = 0, float("nan")
    for k, (n_steps, first_only) in enumerate(phases):
        drilling = replace(config, sft=replace(sft, steps=n_steps))
        learners = start_learners(drilling, str(model_dir), mode="sft")
        try:
            for _ in range(n_steps):
                batch = [
                    conversation_example(*drills.sample(rng, first_only))
                    for _ in range(sft.copy_drill_batch_size)
                ]
                stats = learners.sft_step(collate(batch, tokenizer.pad_token_id))
                loss = stats["loss"]
                sink.log_metrics(
                    {"sft/copy_drill_loss": loss, "sft/copy_drill_lr": stats["lr"]}, step
                )
                step += 1
                if on_step is not None:
                    on_step(1)
            last = k == len(phases) - 1
            model_dir = local_path(
                join(config.run_dir, "copy_drills" if last else "copy_drills_first")
            )
            learners.export(str(model_dir))
        finally:
            learners.close()
    logger.info("copy drills: %d steps, final loss %.3f", sft.copy_drill_steps, loss)
    return Path(model_dir)
