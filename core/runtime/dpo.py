"""The DPO stage: the policy trained on preference pairs against a frozen copy of its starting
weights (Rafailov et al., arXiv 2305.18290), on the same learner ranks (FSDP2, LoRA) as RL.

A pair becomes two rows, chosen then rejected, each the prompt and one answer with the loss mask
on the answer (as SFT builds them, so DPO and SFT see the same tokens). Held-out pairs are scored
before and after training:

* ``preference_accuracy``: the share of pairs whose chosen answer the policy finds more likely
  than the rejected one (sequence log-probabilities; a tie counts half) — what the policy
  prefers, comparable between any two models;
* ``reward_accuracy`` / ``reward_margin``: DPO's implicit reward ``β·(log π − log π_ref)``,
  chosen against rejected (at the start every margin is 0).
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
from core.runtime.handles import LearnerHandle
from core.runtime.metrics import MetricSink
from core.runtime.placement import start_learners
from core.runtime.sft import conversation_example, sft_example
from core.runtime.stages import PreparedData, data_seed
from core.storage import join, local_path, upload_dir, write_json, write_jsonl
from core.training import TrainBatch, collate

logger = logging.getLogger(__name__)

EVAL_CHUNK = 64  # held-out pairs per no-grad pass


@dataclass
class DPOResult:
    """The DPO stage's model and its held-out preference numbers before and after."""

    model_dir: str
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    seconds: float
    notes: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"steps": self.steps, "seconds": self.seconds, "before": self.before,
                "after": self.after, "model_dir": self.model_dir, **self.notes}  # fmt: skip


def prepare_pairs(config: Config, data: PreparedData) -> PreferencePairs:
    """``dpo.pairs``, validated and written to ``{run_dir}/preference/{train,test}.jsonl``
    (before the model is built: a bad file or column fails before any training)."""
    d = config.dpo
    try:
        if d.pairs == "synthetic":
            pairs = task_pairs(data.train, data.test, data_seed(config), config.data.source)
        else:
            pairs = load_pairs(d, data_seed(config))
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from None
    base = join(config.run_dir, "preference")
    write_jsonl(join(base, "test.jsonl"), pairs.test)
    write_jsonl(join(base, "train.jsonl"), pairs.train)
    write_json(join(base, "notes.json"), pairs.notes)
    logger.info("preference pairs: %d train / %d held out", len(pairs.train), len(pairs.test))
    return pairs


def pair_rows(prompter: Prompter, pair: dict) -> tuple[Trajectory, Trajectory]:
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


def _batch(rows: list[tuple[Trajectory, Trajectory]], pad_id: int) -> TrainBatch:
    """Chosen and rejected rows interleaved: row 2i and 2i+1 are pair i."""
    return collate([row for pair in rows for row in pair], pad_id)


def sequence_logprobs(
    learners: LearnerHandle, rows: list[tuple[Trajectory, Trajectory]], pad_id: int,
    *, reference: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``[pairs, 2]`` log-probs of (chosen, rejected) answers, no grad."""
    parts = [
        learners.sequence_logprobs(_batch(rows[i : i + EVAL_CHUNK], pad_id), reference)
        for i in range(0, len(rows), EVAL_CHUNK)
    ]
    return torch.cat(parts).view(-1, 2)


def preference_metrics(
    policy: torch.Tensor, reference: torch.Tensor, beta: float
) -> dict[str, float]:
    """Held-out numbers from ``[pairs, 2]`` (chosen, rejected) log-probs (module docstring)."""
    chosen, rejected = policy[:, 0], policy[:, 1]
    margin = beta * ((chosen - reference[:, 0]) - (rejected - reference[:, 1]))
    return {
        "preference_accuracy": float(
            ((chosen > rejected).float() + 0.5 * (chosen == rejected)).mean()
        ),
        "reward_accuracy": float((margin > 0).float().mean()),
        "reward_margin": float(margin.mean()),
        "chosen_logp": float(chosen.mean()),
        "rejected_logp": float(rejected.mean()),
    }


def dpo_train(
    config: Config,
    model_dir: str,
    pairs: PreferencePairs,
    sink: MetricSink,
    on_step: Callable[[int], None] | None = None,
) -> DPOResult:
    """Run ``dpo.steps`` optimizer steps from ``model_dir``; returns the exported model (under
    ``{run_dir}/dpo``) and the held-out preference numbers before and after."""
    d = config.dpo
    tokenizer = load_tokenizer(config.model.tokenizer_path or model_dir)
    prompter = Prompter.from_config(config, tokenizer)
    pad = tokenizer.pad_token_id
    train = [pair_rows(prompter, pair) for pair in pairs.train]
    test = [pair_rows(prompter, pair) for pair in pairs.test[: d.n_test or None]]
    loader = ResumableDataLoader(train, batch_size=d.batch_size, shuffle=True,
                                 seed=config.experiment.seed)  # fmt: skip
    learners = start_learners(config, str(model_dir), mode="dpo")
    started = time.perf_counter()
    try:
        reference = sequence_logprobs(learners, test, pad, reference=True)
        before = preference_metrics(reference, reference, d.beta)
        sink.log_metrics({f"dpo_eval/{k}": v for k, v in before.items()}, 0)
        for step in range(d.steps):
            stats = learners.dpo_step(_batch(loader.next_batch(), pad))
            sink.log_metrics(_step_metrics(stats), step + 1)
            if on_step is not None:
                on_step(1)
        after = preference_metrics(sequence_logprobs(learners, test, pad), reference, d.beta)
        sink.log_metrics({f"dpo_eval/{k}": v for k, v in after.items()}, d.steps)
        url = join(config.run_dir, "dpo")
        out = local_path(url)
        learners.export(str(out))
        upload_dir(out, url)
    finally:
        learners.close()
    seconds = time.perf_counter() - started
    logger.info(
        "DPO: %d steps in %.1f s; held-out preference accuracy %.3f -> %.3f",
        d.steps, seconds, before["preference_accuracy"], after["preference_accuracy"],
    )  # fmt: skip
    return DPOResult(str(out), before, after, d.steps, seconds, {"n_test_pairs": len(test)})


def _step_metrics(stats: dict[str, float]) -> dict[str, float]:
    keys = ("loss", "reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward",
            "chosen_logp", "rejected_logp", "lr", "grad_norm")  # fmt: skip
    metrics = {f"dpo/{k}": stats[k] for k in keys}
    metrics["dpo/tokens_per_s"] = stats["tokens"] / max(stats["seconds"], 1e-9)
    return metrics
