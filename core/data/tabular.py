"""Any tabular dataset as samples: a hub id, a ``save_to_disk`` folder, or JSONL/parquet/CSV files
at any fsspec URL, with the columns mapped to a sample's ``question`` and ``answer``.

A sample is ``{"id", "question", "answer", ...}`` (the reward function scores a completion
against ``answer``; a list or dict answer, such as a code task's tests, is kept as JSON);
``system`` and metadata columns ride along when mapped (a ``solution`` column is the SFT target
when the answer is not one: see :func:`core.data.prompting.sft_target`). A column that the
data does not have fails at once, naming the column and the ones it has.
"""

from __future__ import annotations

import copy
import json
import logging
import random
from dataclasses import dataclass

import fsspec

from core.data.gsm8k import read_jsonl_lines, utf8_problem

logger = logging.getLogger(__name__)

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class ColumnError(ValueError):
    """A mapped column is not in the data."""


@dataclass
class Columns:
    """Which columns hold what (``data.prompt_key`` etc.)."""

    prompt: str = "question"
    answer: str = "answer"
    system: str = ""  # a per-sample system prompt column, or none
    id: str = ""  # a stable id column, or none (then ``{name}-{split}-{row}``)
    metadata: tuple[str, ...] = ()  # carried into the sample unchanged


def load_table(
    path: str, split: str, storage_options: dict | None = None
) -> tuple[list[dict], str]:
    """The rows of ``split`` and a label for messages.

    ``path`` is a local or fsspec URL of a file (``.jsonl``/``.json``/``.parquet``/``.csv``), a
    folder holding ``{split}.<ext>`` or a ``save_to_disk`` dataset, or else a hub id.
    """
    options = copy.deepcopy(storage_options or {})
    fs, root = fsspec.core.url_to_fs(path, **options)
    root = root.rstrip("/")
    if fs.isdir(root):
        if fs.exists(f"{root}/dataset_dict.json") or fs.exists(f"{root}/state.json"):
            return _from_disk(path, split, options), f"{path} [{split}]"
        found = [f"{root}/{split}{ext}" for ext in _FORMATS if fs.isfile(f"{root}/{split}{ext}")]
        if not found:
            names = ", ".join(f"{split}{ext}" for ext in _FORMATS)
            raise FileNotFoundError(f"no {names} and no save_to_disk dataset under {path}")
        file = fs.unstrip_protocol(found[0]) if "://" in path else found[0]
        return _read_file(file, options), file
    if fs.isfile(root):
        return _read_file(path, options), path
    if "://" in path or path.startswith((".", "/")):
        raise FileNotFoundError(f"dataset not found: {path}")
    import datasets  # a hub id

    return datasets.load_dataset(path, split=split).to_list(), f"hub:{path} [{split}]"


def _read_file(url: str, options: dict) -> list[dict]:
    ext = next((e for e in _FORMATS if url.endswith(e)), None)
    if ext is None:
        raise ValueError(f"{url}: unsupported file type; expected one of {sorted(_FORMATS)}")
    if ext == ".jsonl":  # line by line: a bad line is reported by number, not fatal
        rows, bad = read_jsonl_lines(url, options)
        if bad:
            shown = "; ".join(f"{where}: {why}" for where, why in bad[:5])
            logger.warning("skipped %d unreadable line(s) of %s (%s)", len(bad), url, shown)
        return [row for _, row in rows]
    import datasets

    try:
        ds = datasets.load_dataset(
            _FORMATS[ext], data_files=url, split="train", storage_options=copy.deepcopy(options)
        )
    except Exception as err:  # datasets wraps the decoding error in its own
        where = _first_non_utf8_line(url, options) if ext in (".csv", ".json") else None
        if where is None:
            raise
        raise ValueError(f"{url}: {where}; re-save the file as UTF-8") from err
    return ds.to_list()


def _first_non_utf8_line(url: str, options: dict) -> str | None:
    """``"line 3 is not UTF-8 (byte 0xe9 at byte 12)"`` for a text file's first such line."""
    with fsspec.open(url, "rb", **copy.deepcopy(options)) as f:
        for number, raw in enumerate(f, start=1):
            problem = utf8_problem(raw)
            if problem is not None:
                return f"line {number} is {problem}"
    return None


def _from_disk(path: str, split: str, options: dict) -> list[dict]:
    import datasets

    loaded = datasets.load_from_disk(path, storage_options=copy.deepcopy(options) or None)
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{path} has splits {sorted(loaded)}, not {split!r}")
        loaded = loaded[split]
    return loaded.to_list()


def to_samples(rows: list[dict], columns: Columns, label: str, name: str) -> list[dict]:
    """Map ``rows`` to samples; a missing column raises :class:`ColumnError` naming the ones
    there are. Rows with an empty prompt or answer are skipped with one warning."""
    available = sorted({key for row in rows[:100] for key in row})
    wanted = [("data.prompt_key", columns.prompt), ("data.answer_key", columns.answer)]
    wanted += [("data.system_key", columns.system)] if columns.system else []
    wanted += [("data.id_key", columns.id)] if columns.id else []
    wanted += [("data.metadata_keys", key) for key in columns.metadata]
    for field, column in wanted:
        if rows and column not in available:
            raise ColumnError(
                f"{field}={column!r}: {label} has no such column; its columns are {available}"
            )
    samples, skipped = [], 0
    for index, row in enumerate(rows):
        question, answer = row.get(columns.prompt), row.get(columns.answer)
        if question in (None, "") or answer in (None, ""):
            skipped += 1
            continue
        sample = {
            "id": str(row[columns.id]) if columns.id else f"{name}-{index}",
            "question": str(question),
            # a list/dict column (a code task's tests) as JSON, not as Python's repr
            "answer": json.dumps(answer) if isinstance(answer, list | dict) else str(answer),
            **{key: row.get(key) for key in columns.metadata},
        }
        if columns.system and row.get(columns.system):
            sample["system"] = str(row[columns.system])
        samples.append(sample)
    if skipped:
        logger.warning(
            "skipped %d of %d rows of %s: empty prompt or answer", skipped, len(rows), label
        )
    return samples


def split_by_ratio(samples: list[dict], ratio: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, test) with ``ratio`` of ``samples`` held out, shuffled by ``seed``."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    n_test = round(len(samples) * ratio)
    test = [samples[i] for i in sorted(order[:n_test])]
    train = [samples[i] for i in sorted(order[n_test:])]
    return train, test


def remove_test_questions(train: list[dict], test: list[dict]) -> tuple[list[dict], int]:
    """``train`` without the questions that are also in ``test`` (whitespace and case aside)."""

    def key(sample: dict) -> str:
        return " ".join(sample["question"].split()).lower()

    held_out = {key(s) for s in test}
    kept = [s for s in train if key(s) not in held_out]
    return kept, len(train) - len(kept)
