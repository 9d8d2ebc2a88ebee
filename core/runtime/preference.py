"""What the preference stages (DPO, the reward model) share: the pairs, read and checked once
per run, and the rows a pair becomes.

A pair is two rows, chosen then rejected, each the prompt and one answer with the loss mask on
the answer: built as SFT builds its examples, so every stage sees the same tokens. A batch
interleaves them (row ``2i`` is pair ``i``'s chosen answer, ``2i+1`` its rejected one), which is
what ``DPOLoss`` and ``RewardModelLoss`` expect.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from core.config import Config, ConfigError
from core.data.dataloader import ResumableDataLoader
from core.data.preference import PreferencePairs, load_pairs, task_pairs
from core.data.prompting import Prompter
from core.models import load_tokenizer
from core.rollout.api import Trajectory
from core.runtime.checkpointing import CheckpointManager
from core.runtime.handles import LearnerHandle
from core.runtime.metrics import MetricSink
from core.runtime.placement import start_learners
from core.runtime.sft import conversation_example, sft_example
from core.runtime.stage_resume import (
    finished_stage,
    mark_finished,
    resume_point,
    stage_checkpoints,
    stage_params,
)
from core.runtime.stages import PreparedData, data_seed
from core.storage import join, local_path, remove_dir, upload_dir, write_json, write_jsonl
from core.training import TrainBatch, collate

logger = logging.getLogger(__name__)

EVAL_CHUNK = 64  # held-out pairs per no-grad pass
PairRows = tuple[Trajectory, Trajectory]


@dataclass
class PreferenceResult:
    """A preference stage's output folder and its held-out numbers before and after."""

    model_dir: str
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    seconds: float
    notes: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"steps": self.steps, "seconds": self.seconds, "before": self.before,
                "after": self.after, "model_dir": self.model_dir, **self.notes}  # fmt: skip

    @classmethod
    def from_record(cls, model_dir: str, summary: dict) -> PreferenceResult:
        """A finished stage's result, read back from its :meth:`summary` (its folder local)."""
        keys = ("steps", "seconds", "before", "after", "model_dir")
        notes = {k: v for k, v in summary.items() if k not in keys}
        return cls(model_dir, summary["before"], summary["after"], summary["steps"],
                   summary["seconds"], notes)  # fmt: skip


def needs_pairs(config: Config) -> bool:
    """Whether a stage of this run trains on preference pairs."""
    return config.dpo.enabled or config.reward_model.enabled


def prepare_pairs(config: Config, data: PreparedData) -> PreferencePairs:
    """``preference.pairs``, checked and written to ``{run_dir}/preference/{train,test}.jsonl``
    (before the model is built: a bad file or column fails before any training)."""
    spec = config.preference
    try:
        if spec.pairs == "synthetic":
            pairs = task_pairs(data.train, data.test, data_seed(config), config.data.source,
                               spec.hard_fraction)  # fmt: skip
        else:
            pairs = load_pairs(spec, data_seed(config))
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from None
    base = join(config.run_dir, "preference")
    write_jsonl(join(base, "test.jsonl"), pairs.test)
    write_jsonl(join(base, "train.jsonl"), pairs.train)
    write_json(join(base, "notes.json"), pairs.notes)
    logger.info("preference pairs: %d train / %d held out", len(pairs.train), len(pairs.test))
    return pairs


def pair_rows(prompter: Prompter, pair: dict) -> PairRows:
    """The pair's chosen and rejected rows, the loss mask on each answer."""
    return _row(prompter, pair, pair["chosen"]), _row(prompter, pair, pair["rejected"])


def _row(prompter: Prompter, pair: dict, answer: str | list[dict]) -> Trajectory:
    prompt = pair["question"]
    if isinstance(prompt, str) and isinstance(answer, str):
        return sft_example(
            prompter.prompt_ids(prompt, pair.get("system")), prompter.target_ids(answer)
        )
    opening = prompt if isinstance(prompt, list) else prompter.opening(prompt, pair.get("system"))
    turns = answer if isinstance(answer, list) else [{"role": "assistant", "content": answer}]
    return conversation_example(*prompter.conversation_ids([*opening, *turns]))


def pairwise_wins(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """The share of pairs whose chosen score is higher (a tie counts half)."""
    return float(((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean())


def pair_batch(rows: list[PairRows], pad_id: int) -> TrainBatch:
    """Chosen and rejected rows interleaved: rows 2i and 2i+1 are pair i."""
    return collate([row for pair in rows for row in pair], pad_id)


@dataclass
class PairData:
    """A stage's pairs as rows: a shuffled training stream and the held-out list."""

    train: list[PairRows]
    test: list[PairRows]
    pad_id: int
    seed: int
    batch_size: int

    @classmethod
    def build(
        cls, config: Config, model_dir: str, pairs: PreferencePairs, batch_size: int
    ) -> PairData:
        tokenizer = load_tokenizer(config.model.tokenizer_path or model_dir)
        prompter = Prompter.from_config(config, tokenizer)
        n_test = config.preference.n_test or None
        return cls(
            train=[pair_rows(prompter, pair) for pair in pairs.train],
            test=[pair_rows(prompter, pair) for pair in pairs.test[:n_test]],
            pad_id=tokenizer.pad_token_id,
            seed=config.experiment.seed,
            batch_size=batch_size,
        )

    def loader(self) -> ResumableDataLoader:
        """The training pairs, shuffled per epoch by the run's seed (resumable)."""
        return ResumableDataLoader(self.train, batch_size=self.batch_size, shuffle=True,
                                   seed=self.seed)  # fmt: skip

    def score_test(self, score: Callable[[TrainBatch], torch.Tensor]) -> torch.Tensor:
        """``[pairs, 2]`` (chosen, rejected) scores of the held-out pairs, ``score`` giving one
        number per row of a batch."""
        parts = [
            score(pair_batch(self.test[i : i + EVAL_CHUNK], self.pad_id))
            for i in range(0, len(self.test), EVAL_CHUNK)
        ]
        return torch.cat(parts).view(-1, 2)


@dataclass
class PairStage:
    """What differs between the stages that train on pairs."""

    name: str  # the learner mode, the metric prefix and the output folder under the run
    steps: int
    batch_size: int
    step: Callable[[LearnerHandle], Callable[[TrainBatch], dict[str, float]]]  # its train step
    # Held-out numbers; ``trained`` is False before the first step of the stage.
    evaluate: Callable[[LearnerHandle, PairData, bool], dict[str, float]]
    step_keys: tuple[str, ...]  # of a step's statistics, the ones logged


def train_on_pairs(
    config: Config,
    model_dir: str,
    pairs: PreferencePairs,
    sink: MetricSink,
    on_step: Callable[[int], None] | None,
    stage: PairStage,
) -> PreferenceResult:
    """Held-out numbers, ``stage.steps`` optimizer steps on the learner ranks, numbers again;
    the model is exported to ``{run_dir}/{stage.name}``. Metrics: ``{name}/*`` per step and
    ``{name}_eval/*`` at the first and last.

    Under ``checkpoint.recover=auto`` a stage this run finished is reused, and one stopped
    midway goes on from its newest checkpoint (:mod:`core.runtime.stage_resume`).
    """
    done = finished_stage(config, stage.name)
    if done is not None:
        return PreferenceResult.from_record(*done)
    data = PairData.build(config, model_dir, pairs, stage.batch_size)
    ckpt = stage_checkpoints(config, stage.name)
    every = config.checkpoint.every_n_steps
    loader = data.loader()
    learners = start_learners(config, str(model_dir), mode=stage.name)
    try:
        resume = resume_point(config, stage.name, ckpt)
        if resume is None:
            remove_dir(ckpt.url)  # another attempt's (stale) checkpoints must not be pruned into
            start, spent, before = 0, 0.0, stage.evaluate(learners, data, False)
            sink.log_metrics({f"{stage.name}_eval/{k}": v for k, v in before.items()}, 0)
        else:
            learners.load_checkpoint(resume["url"])
            loader.load_state_dict(resume["loader"])
            start, spent, before = resume["step"], resume["seconds"], resume["before"]
            if on_step is not None:
                on_step(start)
        started, step = time.perf_counter(), stage.step(learners)
        for k in range(start, stage.steps):
            stats = step(pair_batch(loader.next_batch(), data.pad_id))
            metrics = {f"{stage.name}/{key}": stats[key] for key in stage.step_keys}
            metrics[f"{stage.name}/tokens_per_s"] = stats["tokens"] / max(stats["seconds"], 1e-9)
            sink.log_metrics(metrics, k + 1)
            if every and (k + 1) % every == 0 and k + 1 < stage.steps:
                seconds = spent + time.perf_counter() - started
                _commit(config, stage.name, ckpt, learners, k + 1, loader, before, seconds)
            if on_step is not None:
                on_step(1)
        seconds = spent + time.perf_counter() - started
        after = stage.evaluate(learners, data, stage.steps > 0)
        sink.log_metrics({f"{stage.name}_eval/{k}": v for k, v in after.items()}, stage.steps)
        url = join(config.run_dir, stage.name)
        out = local_path(url)
        learners.export(str(out))
        upload_dir(out, url)
    finally:
        learners.close()
    notes = {"n_test_pairs": len(data.test), **({"resumed_from": start} if start else {})}
    result = PreferenceResult(str(out), before, after, stage.steps, seconds, notes)
    mark_finished(config, stage.name, result.summary())
    remove_dir(ckpt.url)  # the stage is done: its optimizer states are not needed again
    return result


def _commit(
    config: Config,
    name: str,
    ckpt: CheckpointManager,
    learners: LearnerHandle,
    step: int,
    loader: ResumableDataLoader,
    before: dict[str, float],
    seconds: float,
) -> None:
    """Checkpoint a pair stage after ``step`` optimizer steps."""
    ckpt.begin(step)
    learners.save_checkpoint(join(ckpt.path(step), "learner"))
    record = {"step": step, "loader": loader.state_dict(), "before": before, "seconds": seconds,
              "params": stage_params(config, name)}  # fmt: skip
    ckpt.commit(step, record)
