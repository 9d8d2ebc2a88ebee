"""GSM8K loading from the bundled copy, the Hugging Face Hub, or any fsspec URL.

Every loader returns plain sample dicts ``{"id", "question", "answer", ...}``; rows that are
unusable for training or scoring (no question, no answer, no ``#### N`` final number) are
skipped with one warning, or rejected with ``strict=True``.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).parent / "gsm8k"
HUB_DATASET = "openai/gsm8k"
BUNDLED_SPLITS = ("train", "test")

# Folder/prefix sources are searched for these files, in this order.
_FOLDER_SUFFIXES = (".jsonl", ".parquet", ".json")
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# How many bad rows the skip warning spells out.
_WARN_EXAMPLES = 5

# GSM8K final answers may carry thousands separators ("#### 1,200") or a sign/decimal.
_FINAL_RE = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")


def _final_number(answer: str) -> float | None:
    """The number after the last ``####`` in a GSM8K solution, or None.

    Private on purpose: core.rewards owns answer parsing; this only decides whether a row is
    usable and will be deduplicated against it later.
    """
    matches = _FINAL_RE.findall(answer)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def _row_problem(row: Any) -> str | None:
    """Why ``row`` is unusable, or None when it is fine."""
    if not isinstance(row, dict):
        return f"row is a {type(row).__name__}, not a dict"
    for key in ("question", "answer"):
        value = row.get(key)
        if value is None:
            return f"missing {key!r}"
        if not isinstance(value, str):
            return f"{key!r} is a {type(value).__name__}, not a str"
        if not value.strip():
            return f"empty {key!r}"
    if _final_number(row["answer"]) is None:
        return "answer has no parsable '#### N' final number"
    return None


def validate_rows(
    rows: Iterable[dict],
    source: str,
    strict: bool = False,
    *,
    labels: list[str] | None = None,
    unreadable: Iterable[tuple[str, str]] = (),
) -> list[dict]:
    """Keep the usable rows of ``rows``; ``source`` names where they came from in messages.

    A row needs non-empty string ``question`` and ``answer`` fields and an answer ending in a
    parsable ``#### N``. Bad rows are skipped with a single warning listing the count and the
    first few (where and why); with ``strict=True`` the first bad row raises ValueError.
    ``labels[i]`` names row ``i`` (default ``row i``; a JSONL file's rows are ``line N``), and
    ``unreadable`` holds ``(label, reason)`` of records that could not even be parsed.
    """
    good: list[dict] = []
    bad: list[tuple[str, str]] = list(unreadable)
    total = len(bad)
    for index, row in enumerate(rows):
        total += 1
        reason = _row_problem(row)
        if reason is None:
            good.append(row)
            continue
        label = labels[index] if labels is not None else f"row {index}"
        if strict:
            raise ValueError(f"{source}: bad {label}: {reason}")
        bad.append((label, reason))
    if bad:
        shown = "; ".join(f"{where}: {why}" for where, why in bad[:_WARN_EXAMPLES])
        more = f"; ... and {len(bad) - _WARN_EXAMPLES} more" if len(bad) > _WARN_EXAMPLES else ""
        logger.warning("Skipped %d of %d rows from %s (%s%s)", len(bad), total, source, shown, more)
    return good


def read_jsonl_lines(
    url: str, storage_options: dict | None = None, strict: bool = False
) -> tuple[list[tuple[int, dict]], list[tuple[str, str]]]:
    """Parse a JSONL file line by line: ``([(line number, row)], [(\"line N\", reason)])``.

    Blank lines are skipped; a line that is not UTF-8, not JSON, or not a JSON object, is
    reported with its number (with ``strict`` it raises ValueError naming the file and line) instead of
    failing the whole file as a bulk parser would.
    """
    import fsspec

    rows: list[tuple[int, dict]] = []
    bad: list[tuple[str, str]] = []
    with fsspec.open(url, "rb", **copy.deepcopy(storage_options or {})) as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            row, reason = _parse_line(raw)
            if reason is None:
                rows.append((number, row))
            elif strict:
                raise ValueError(f"{url}: bad line {number}: {reason}")
            else:
                bad.append((f"line {number}", reason))
    return rows, bad


def utf8_problem(raw: bytes) -> str | None:
    """``"not UTF-8 (byte 0xe9 at byte 12)"`` for a line that does not decode, else None."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not UTF-8 (byte 0x{raw[err.start]:02x} at byte {err.start + 1})"
    return None


def _parse_line(raw: bytes) -> tuple[dict, None] | tuple[None, str]:
    """A JSONL line as ``(row, None)``, or ``(None, why not)``: not UTF-8, not JSON, not an
    object."""
    problem = utf8_problem(raw)
    if problem is not None:
        return None, problem
    try:
        row = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as err:
        return None, f"invalid JSON ({err.msg} at column {err.colno})"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    return row, None


def _resolve_file(url: str, split: str, storage_options: dict) -> tuple[str, str]:
    """Map a file or folder URL to (file URL for datasets, datasets builder name)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **copy.deepcopy(storage_options))
    path = path.rstrip("/")
    if not fs.isfile(path):
        if not fs.isdir(path):
            raise FileNotFoundError(f"GSM8K source not found: {url}")
        candidates = [f"{path}/{split}{suffix}" for suffix in _FOLDER_SUFFIXES]
        found = [c for c in candidates if fs.isfile(c)]
        if not found:
            names = ", ".join(f"{split}{s}" for s in _FOLDER_SUFFIXES)
            raise FileNotFoundError(f"GSM8K source not found: no {names} under {url}")
        path = found[0]
    suffix = next((s for s in _BUILDERS if path.endswith(s)), None)
    if suffix is None:
        raise ValueError(f"{url}: unsupported file type; expected one of {sorted(_BUILDERS)}")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    # datasets wants plain paths for local files and full URLs for remote ones.
    data_url = path if protocol in ("file", "local") else fs.unstrip_protocol(path)
    return data_url, _BUILDERS[suffix]


def _load_file(
    url: str, split: str, storage_options: dict, strict: bool = False
) -> tuple[list[dict], list[int] | None, list[tuple[str, str]]]:
    """(rows, their 1-based line numbers for a JSONL file else None, unreadable records)."""
    import datasets

    data_url, builder = _resolve_file(url, split, storage_options)
    logger.debug("Loading %s as %s", data_url, builder)
    if data_url.endswith(".jsonl"):
        numbered, bad = read_jsonl_lines(data_url, storage_options, strict)
        return [row for _, row in numbered], [n for n, _ in numbered], bad
    ds = datasets.load_dataset(
        builder,
        data_files=data_url,
        split="train",
        # datasets adds an "hf" entry to the dict it is given; never hand it the caller's.
        storage_options=copy.deepcopy(storage_options),
    )
    return ds.to_list(), None, []


def load_gsm8k(
    source: str,
    split: str,
    *,
    storage_options: dict | None = None,
    strict: bool = False,
    limit: int | None = None,
) -> list[dict]:
    """Load GSM8K-format samples ``{"id", "question", "answer", ...}``.

    ``source`` is ``"bundled"`` (the copy in this package), ``"hub"`` (``openai/gsm8k`` on the
    Hugging Face Hub; needs internet), or a path / fsspec URL (``file://``, ``s3://``...) of a
    ``.jsonl``/``.json``/``.parquet`` file or of a folder/prefix holding ``{split}.jsonl`` or
    ``{split}.parquet``. ``storage_options`` go to fsspec (e.g. S3 endpoint and keys) and are
    not modified. Rows without an ``id`` get ``gsm8k-{split}-{index}`` (index in the file).
    Bad rows are skipped with a warning (see :func:`validate_rows`), or raise with ``strict``;
    a JSONL file is parsed line by line, so a malformed line is one bad row named by its line
    number (:func:`read_jsonl_lines`). ``limit`` keeps at most that many valid samples.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    options = dict(storage_options or {})
    if source == "bundled":
        if split not in BUNDLED_SPLITS:
            raise ValueError(f"bundled GSM8K has splits {list(BUNDLED_SPLITS)}, not {split!r}")
        label = f"bundled GSM8K {split}"
        rows, lines, bad = _load_file(str(BUNDLED_DIR / f"{split}.jsonl"), split, {}, strict)
    elif source == "hub":
        import datasets

        label = f"hub:{HUB_DATASET} {split}"
        rows = datasets.load_dataset(HUB_DATASET, "main", split=split).to_list()
        lines, bad = None, []
    else:
        label = source
        rows, lines, bad = _load_file(source, split, options, strict)

    # a row's place in its file (line N of a JSONL file is N - 1) names it in ids and messages
    positions = [n - 1 for n in lines] if lines is not None else list(range(len(rows)))
    labels = [f"line {p + 1}" if lines is not None else f"row {p}" for p in positions]
    for row, position in zip(rows, positions, strict=True):
        if isinstance(row, dict):
            row_id = row.get("id")
            row["id"] = f"gsm8k-{split}-{position}" if row_id is None else str(row_id)
    samples = validate_rows(rows, label, strict=strict, labels=labels, unreadable=bad)
    if limit is not None:
        samples = samples[:limit]
    logger.info("Loaded %d GSM8K samples from %s", len(samples), label)
    return samples
