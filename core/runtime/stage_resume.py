"""Resuming the stages before RL (SFT, the reward model, DPO) under ``checkpoint.recover=auto``.

* A finished stage writes ``{run_dir}/{stage}/stage.json`` after its export: what it measured
  and the settings it ran with (:func:`stage_params`). A rerun of the run reuses the export
  instead of training again, unless one of those settings changed (then it trains afresh and
  says which changed) — a changed warm start trains every stage after it again too, since their
  settings include the warm start's.
* The pair stages (reward model, DPO) also commit checkpoints every ``checkpoint.every_n_steps``
  steps under ``{checkpoint url}/{stage}/step-N``: the learner state (model, optimizer,
  schedule), the data position and the held-out numbers from before the first step. A run
  stopped midway goes on from the newest one that passes its checks; the checkpoints are
  removed once the stage has finished.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from core.config import Config, config_changes, run_params
from core.runtime.checkpointing import CheckpointManager, checkpoint_url
from core.storage import exists, fetch_dir, join, read_text, remove_file, write_json
from core.training import hf_folder_problems

logger = logging.getLogger(__name__)

RECORD = "stage.json"
# The config sections each stage's output depends on, the learner keys that change its numbers,
# and the keys in those sections that only RL reads. (A pairs file's contents are not compared:
# the same preference.pairs URL with new rows is reused.)
STAGE_SECTIONS = {
    "sft": ("experiment", "data", "model", "sft"),
    "reward_model": ("experiment", "data", "model", "sft", "preference", "reward_model"),
    "dpo": ("experiment", "data", "model", "sft", "preference", "dpo"),
}
NUMERICS = ("learner.micro_batch_tokens", "learner.pack_sequences", "sampling.temperature")
RL_ONLY = ("reward_model.use_in_rl", "reward_model.coef", "reward_model.task_coef",
           "reward_model.path", "dpo.eval_start")  # fmt: skip
CHECKPOINT_KEYS = ("step", "loader", "before", "seconds", "params")


def stage_params(config: Config, name: str) -> dict[str, Any]:
    """The run parameters stage ``name``'s output depends on."""
    sections = STAGE_SECTIONS[name]
    return {
        key: value
        for key, value in run_params(config).items()
        if (key.split(".", 1)[0] in sections or key in NUMERICS) and key not in RL_ONLY
    }


def finished_stage(config: Config, name: str) -> tuple[str, dict[str, Any]] | None:
    """Under ``recover=auto``, the local folder and record of stage ``name`` when this run
    finished it with the same settings; else None, and any record it left is removed (the
    stage runs again and writes its own)."""
    url = join(config.run_dir, name)
    if not exists(join(url, RECORD)):
        return None
    record = _read_json(join(url, RECORD)) if config.checkpoint.recover == "auto" else None
    if record is not None:
        problems = hf_folder_problems(url)
        changes = config_changes(record.get("params", {}), config, stage_params(config, name))
        if changes:
            problems.append(f"its settings changed: {'; '.join(changes)}")
        if not problems:
            logger.info("recover=auto: %s already finished in this run, reusing %s", name, url)
            return fetch_dir(url), record["result"]
        logger.warning("recover=auto: training %s again: %s", name, "; ".join(problems))
    remove_file(join(url, RECORD))  # a stage that fails midway must not look finished after
    return None


def stage_result(config: Config, name: str) -> dict[str, Any] | None:
    """What stage ``name`` recorded when it finished in this run folder (None: no record)."""
    record = _read_json(join(config.run_dir, name, RECORD))
    return record["result"] if record is not None else None


def mark_finished(config: Config, name: str, result: dict[str, Any]) -> None:
    """Write stage ``name``'s record beside its export (after it: the export is complete)."""
    write_json(
        join(config.run_dir, name, RECORD),
        {"result": result, "params": stage_params(config, name)},
    )


def stage_checkpoints(config: Config, name: str) -> CheckpointManager:
    """Where pair stage ``name`` commits its checkpoints (no HF export in them)."""
    return CheckpointManager(
        join(checkpoint_url(config), name),
        config.checkpoint.keep_last,
        recover_keys=CHECKPOINT_KEYS,
        with_hf=False,
    )


def resume_point(config: Config, name: str, ckpt: CheckpointManager) -> dict[str, Any] | None:
    """Under ``recover=auto``, the newest committed checkpoint of stage ``name`` that passes its
    checks and was written with the same settings: its ``recover.json`` plus ``url`` (the
    learner state's folder); else None (the stage starts at step 0)."""
    if config.checkpoint.recover != "auto":
        return None
    for step in reversed(ckpt.committed_steps()):
        problems = ckpt.problems(step)
        if not problems:
            record = ckpt.load_recover(step)
            changes = config_changes(record["params"], config, stage_params(config, name))
            if not changes:
                logger.info("recover=auto: resuming %s from %s", name, ckpt.path(step))
                return {**record, "url": join(ckpt.path(step), "learner")}
            problems = [f"its settings changed: {'; '.join(changes)}"]
        logger.warning("recover=auto: skipping %s: %s", ckpt.path(step), "; ".join(problems))
    return None


def _read_json(url: str) -> dict[str, Any] | None:
    try:
        return json.loads(read_text(url))
    except (OSError, ValueError):  # absent, or torn
        return None
