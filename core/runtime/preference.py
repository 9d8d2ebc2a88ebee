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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from core.config import Config, ConfigError
from core.data.dataloader import ResumableDataLoader
from core.data.preference import PreferencePairs, load_pairs, task_pairs
from core.data.prompting import Prompter
from core.models import load_tokenizer
from core.rollout.api import Trajectory
from core.runtime.handles import LearnerHandle
from core.runtime.metrics import MetricSink
from core.runtime.placement import start_learners
from core.runtime.sft import conversation_example, sft_example
from core.runtime.stages import PreparedData, data_seed
from core.storage import join, local_path, upload_dir, write_json, write_jsonl
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

    def batches(self) -> Iterator[TrainBatch]:
        loader = ResumableDataLoader(self.train, batch_size=self.batch_size, shuffle=True,
                                     seed=self.seed)  # fmt: skip
        while True:
            yield pair_batch(loader.next_batch(), self.pad_id)

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
    evaluate: Callable[[LearnerHandle, PairData], dict[str, float]]  # held-out numbers
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
    ``{name}_eval/*`` at the first and last."""
    data = PairData.build(config, model_dir, pairs, stage.batch_size)
    learners = start_learners(config, str(model_dir), mode=stage.name)
    try:
        before = stage.evaluate(learners, data)
        sink.log_metrics({f"{stage.name}_eval/{k}": v for k, v in before.items()}, 0)
        started, batches, step = time.perf_counter(), data.batches(), stage.step(learners)
        for k in range(stage.steps):
            stats = step(next(batches))
            metrics = {f"{stage.name}/{key}": stats[key] for key in stage.step_keys}
            metrics[f"{stage.name}/tokens_per_s"] = stats["tokens"] / max(stats["seconds"], 1e-9)
            sink.log_metrics(metrics, k + 1)
            if on_step is not None:
                on_step(1)
        seconds = time.perf_counter() - started
        after = stage.evaluate(learners, data)
        sink.log_metrics({f"{stage.name}_eval/{k}": v for k, v in after.items()}, stage.steps)
        url = join(config.run_dir, stage.name)
        out = local_path(url)
        learners.export(str(out))
        upload_dir(out, url)
    finally:
        learners.close()
    notes = {"n_test_pairs": len(data.test)}
    return PreferenceResult(str(out), before, after, stage.steps, seconds, notes)
