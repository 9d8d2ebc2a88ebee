"""Preference pairs for DPO: ``{"id", "question", "chosen", "rejected"}`` (+ ``"system"``).

``question`` is the prompt: text (rendered like any question, through ``data.template`` or the
chat template) or a list of chat messages. ``chosen`` / ``rejected`` are the two answers: text,
or the assistant turns as messages. Pairs come from

* a file or dataset (:func:`load_pairs`): JSONL/parquet/CSV at any fsspec URL, a folder with
  ``{split}.<ext>``, a ``save_to_disk`` dataset or a hub id, the columns named by
  ``preference.prompt_key`` / ``chosen_key`` / ``rejected_key``. A missing column fails at once naming
  the columns there are; malformed JSONL lines and unusable rows are counted (with line or row
  numbers) in the notes and skipped;
* the task's own problems (:func:`synthetic_pairs`): a worked, correct solution preferred over a
  wrong answer (given directly, or worked with its last calculation wrong), so that the whole
  pipeline runs offline.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from typing import Any

import fsspec

from core.data.gsm8k import read_jsonl_lines
from core.data.tabular import ColumnError, load_table, split_by_ratio
from core.schema import documented

logger = logging.getLogger(__name__)


@dataclass
class PreferenceSpec:
    """Where the preference pairs come from (the ``preference`` section)."""

    pairs: str = documented(
        "synthetic",
        "'synthetic' (from the task's own problems: its worked, correct solution preferred over "
        "a direct answer with a wrong number; needs answers ending in '#### N', as "
        "data.source=synthetic and gsm8k have) or a JSONL/parquet/CSV file, a folder with "
        "{split}.<ext> or a save_to_disk dataset, at any fsspec URL, or a hub id, with the "
        "columns below.",
    )
    test_pairs: str = documented(
        "",
        "Held-out pairs: a file, or '' = the 'test' split of preference.pairs when it is a "
        "folder or hub id with one, else preference.test_ratio of its pairs.",
    )
    test_ratio: float = documented(
        0.1, "Share of preference.pairs held out when there are no test pairs.", gt=0, le=0.5
    )
    prompt_key: str = documented(
        "prompt", "Column with the prompt: text (rendered like data.template) or chat messages."
    )
    chosen_key: str = documented(
        "chosen", "Column with the preferred answer: text, or the assistant turns as messages."
    )
    rejected_key: str = documented(
        "rejected", "Column with the rejected answer: text, or the assistant turns as messages."
    )
    n_test: int = documented(
        200, "Held-out pairs the preference numbers are measured on (0 = all).", ge=0
    )
    hard_fraction: float = documented(
        0.5,
        "preference.pairs=synthetic: the share of rejected answers that are worked, with their "
        "last calculation wrong (the rest answer directly with a wrong number).",
        ge=0,
        le=1,
    )


_FINAL = re.compile(r"\n?#### *(-?\d+)\s*$")
_CALCULATION = re.compile(r"<<([^<>=]+)=(-?\d+)>>(-?\d+)")  # GSM8K's calculator annotations


@dataclass
class PreferencePairs:
    """Training and held-out pairs, and what loading skipped."""

    train: list[dict]
    test: list[dict]
    notes: dict[str, Any] = field(default_factory=dict)


def synthetic_pairs(
    samples: list[dict], seed: int, split: str, hard_fraction: float = 0.5
) -> list[dict]:
    """A pair per sample with a worked solution ending in ``#### N``: that solution (chosen)
    against a wrong answer M, 1 to 3 away from N (rejected): worked, its last calculation
    ``<<a+b=N>>N`` made wrong (``<<a+b=M>>M``), for a ``hard_fraction`` share — telling those
    apart takes the arithmetic, not only the style — else given directly (``#### M``).
    Samples whose answer is already direct, or not a whole number, are skipped; a worked answer
    without ``<<…>>`` calculations gets the direct kind. Deterministic in ``seed`` and ``split``."""
    rng = random.Random(f"pairs-{seed}-{split}")
    pairs = []
    for sample in samples:
        answer = sample.get("answer")
        match = _FINAL.search(answer) if isinstance(answer, str) else None
        working = answer[: match.start()] if match is not None else ""
        if not working.strip():
            continue
        wrong = int(match.group(1)) + rng.choice((-3, -2, -1, 1, 2, 3))
        steps = list(_CALCULATION.finditer(working))
        if rng.random() < 1 - hard_fraction or not steps:
            rejected, kind = f"#### {wrong}", "direct"
        else:
            last = steps[-1]
            wrong_step = f"<<{last.group(1)}={wrong}>>{wrong}"
            rejected = f"{working[: last.start()]}{wrong_step}{working[last.end() :]}\n#### {wrong}"
            kind = "worked"
        pair = {"id": sample["id"], "question": sample["question"], "chosen": answer,
                "rejected": rejected, "rejected_kind": kind}  # fmt: skip
        if sample.get("system"):
            pair["system"] = sample["system"]
        pairs.append(pair)
    return pairs


def task_pairs(
    train: list[dict], test: list[dict], seed: int, source: str, hard_fraction: float = 0.5
) -> PreferencePairs:
    """``preference.pairs=synthetic``: pairs from the task's training and held-out problems."""
    pairs = PreferencePairs(
        synthetic_pairs(train, seed, "train", hard_fraction),
        synthetic_pairs(test, seed, "test", hard_fraction),
    )
    if not pairs.train or not pairs.test:
        raise ValueError(
            f"preference.pairs=synthetic needs worked answers ending in '#### N' in both splits; "
            f"data.source={source!r} gave {len(pairs.train)} train / {len(pairs.test)} test "
            "pairs: give a file of pairs in preference.pairs instead"
        )
    return pairs


def load_pairs(
    spec: PreferenceSpec, seed: int, storage_options: dict | None = None
) -> PreferencePairs:
    """The pairs of ``preference.pairs`` (train) and ``preference.test_pairs`` (held out; else
    the dataset's ``test`` split when it has one, else ``preference.test_ratio`` of the training
    pairs)."""
    notes: dict[str, Any] = {}
    train = _pairs(spec, spec.pairs, "train", notes, storage_options)
    if spec.test_pairs:
        test = _pairs(spec, spec.test_pairs, "test", notes, storage_options)
    elif _has_test_split(spec.pairs, storage_options):
        test = _pairs(spec, spec.pairs, "test", notes, storage_options)
    else:
        train, test = split_by_ratio(train, spec.test_ratio, seed)
    if not train or not test:
        raise ValueError(
            f"preference.pairs={spec.pairs!r}: {len(train)} training and {len(test)} held-out pairs are "
            "usable; both must be > 0"
        )
    return PreferencePairs(train, test, notes)


def _has_test_split(path: str, options: dict | None) -> bool:
    if "://" not in path and not path.startswith((".", "/", "~")):
        return True  # a hub id: its test split is asked for (and fails by name if absent)
    fs, root = fsspec.core.url_to_fs(path, **(options or {}))
    if not fs.isdir(root):
        return False
    return any(fs.exists(f"{root.rstrip('/')}/{name}") for name in
               ("test.jsonl", "test.json", "test.parquet", "test.csv", "test", "dataset_dict.json"))  # fmt: skip


def _pairs(
    spec: PreferenceSpec, path: str, split: str, notes: dict[str, Any], options: dict | None
) -> list[dict]:
    rows, label, bad = _read(path, split, options)
    if bad:
        shown = "; ".join(f"{where}: {why}" for where, why in bad[:5])
        logger.warning("skipped %d malformed line(s) of %s (%s)", len(bad), label, shown)
        notes[f"{split}_malformed_lines"] = {"count": len(bad), "first": [w for w, _ in bad[:10]]}
    if not rows:
        raise ValueError(
            f"{label}: no readable rows" + (f" ({len(bad)} malformed lines)" if bad else "")
        )
    available = sorted({key for row in rows[:100] for key in row})
    for key in ("prompt_key", "chosen_key", "rejected_key"):
        column = getattr(spec, key)
        if column not in available:
            raise ColumnError(
                f"preference.{key}={column!r}: {label} has no such column; its columns are {available}"
            )
    pairs, unusable = [], []
    for index, row in enumerate(rows):
        prompt, chosen, rejected = (row.get(getattr(spec, k)) for k in
                                    ("prompt_key", "chosen_key", "rejected_key"))  # fmt: skip
        problem = _problem(prompt, chosen, rejected)
        if problem is not None:
            unusable.append(f"row {index}: {problem}")
            continue
        pairs.append({"id": f"{split}-{index}", "question": prompt, "chosen": chosen,
                      "rejected": rejected})  # fmt: skip
    if unusable:
        logger.warning("skipped %d unusable pair(s) of %s (%s)", len(unusable), label,
                       "; ".join(unusable[:5]))  # fmt: skip
        notes[f"{split}_unusable_pairs"] = {"count": len(unusable), "first": unusable[:10]}
    return pairs


def _read(path: str, split: str, options: dict | None) -> tuple[list[dict], str, list]:
    """Rows, a label, and the malformed lines of a JSONL file (other formats fail whole)."""
    if path.endswith(".jsonl"):
        rows, bad = read_jsonl_lines(path, options)
        return [row for _, row in rows], path, bad
    rows, label = load_table(path, split, options)
    return rows, label, []


def _problem(prompt: Any, chosen: Any, rejected: Any) -> str | None:
    """Why a row is not a usable pair (None when it is)."""
    for name, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if isinstance(value, str):
            if not value.strip():
                return f"empty {name}"
        elif isinstance(value, list):
            if not value or not all(isinstance(m, dict) and "role" in m for m in value):
                return f"{name} is not a list of chat messages"
            if name != "prompt" and any(m["role"] != "assistant" for m in value):
                return f"{name} has a turn that is not the assistant's"
        else:
            return f"{name} is {type(value).__name__}, not text or chat messages"
    if chosen == rejected:
        return "chosen and rejected are the same"
    return None
