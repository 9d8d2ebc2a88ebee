"""GSM8K loading: bundled copy, local files/folders/URLs, row validation, S3 via moto."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.data import load_gsm8k, validate_rows

pytestmark = pytest.mark.unit

ROWS = [
    {"question": "Tom has 3 apples and buys 2 more. How many?", "answer": "3+2=<<3+2=5>>5\n#### 5"},
    {"question": "Mia has 10 pens and loses 4. How many?", "answer": "10-4=6\n#### 6"},
    {"question": "What is 1,000 times 2?", "answer": "#### 2,000"},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _check_rows(samples: list[dict], split: str = "train") -> None:
    assert [s["question"] for s in samples] == [r["question"] for r in ROWS]
    assert [s["answer"] for s in samples] == [r["answer"] for r in ROWS]
    assert [s["id"] for s in samples] == [f"gsm8k-{split}-{i}" for i in range(len(ROWS))]


@pytest.mark.parametrize(("split", "n"), [("train", 7473), ("test", 1319)])
def test_bundled(split: str, n: int) -> None:
    samples = load_gsm8k("bundled", split)
    assert len(samples) == n
    assert samples[0]["id"] == f"gsm8k-{split}-0"
    assert len({s["id"] for s in samples}) == n
    assert all(set(s) == {"id", "question", "answer"} for s in samples)
    assert len(load_gsm8k("bundled", split, limit=5)) == 5


def test_bundled_unknown_split() -> None:
    with pytest.raises(ValueError, match="validation"):
        load_gsm8k("bundled", "validation")


def test_jsonl_by_path_url_and_folder(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "data" / "train.jsonl", ROWS)
    _check_rows(load_gsm8k(str(path), "train"))
    _check_rows(load_gsm8k(f"file://{path}", "train"))
    _check_rows(load_gsm8k(str(path.parent), "train"))
    _check_rows(load_gsm8k(f"file://{path.parent}/", "train"))


def test_parquet_and_json(tmp_path: Path) -> None:
    path = _write_parquet(tmp_path / "pq" / "test.parquet", ROWS)
    _check_rows(load_gsm8k(str(path), "test"), split="test")
    _check_rows(load_gsm8k(f"file://{tmp_path / 'pq'}", "test"), split="test")
    json_path = tmp_path / "rows.json"
    json_path.write_text(json.dumps(ROWS))
    _check_rows(load_gsm8k(str(json_path), "train"))


def test_existing_ids_and_extra_keys_kept(tmp_path: Path) -> None:
    rows = [dict(r, id=f"q{i}", level=i) for i, r in enumerate(ROWS)]
    samples = load_gsm8k(str(_write_jsonl(tmp_path / "x.jsonl", rows)), "train")
    assert [s["id"] for s in samples] == ["q0", "q1", "q2"]
    assert [s["level"] for s in samples] == [0, 1, 2]


def test_storage_options_not_modified(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    options: dict = {"auto_mkdir": False}
    load_gsm8k(str(path), "train", storage_options=options)
    assert options == {"auto_mkdir": False}


def test_missing_sources_name_the_url(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "train.jsonl"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_gsm8k(str(missing), "train")
    with pytest.raises(FileNotFoundError, match=f"file://{missing}"):
        load_gsm8k(f"file://{missing}", "train")
    _write_jsonl(tmp_path / "folder" / "train.jsonl", ROWS)
    with pytest.raises(FileNotFoundError, match=r"test\.jsonl.*folder"):
        load_gsm8k(str(tmp_path / "folder"), "test")


BAD_ROWS = [
    ROWS[0],
    {"answer": "#### 3"},  # missing question
    {"question": "Q?", "answer": ""},  # empty answer
    {"question": "Q?", "answer": "It is five."},  # no ####
    {"question": "Q?", "answer": "#### five"},  # #### without a number
    ROWS[1],
]


def test_bad_rows_skipped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    with caplog.at_level(logging.WARNING, logger="core.data.gsm8k"):
        samples = load_gsm8k(str(path), "train")
    assert [s["id"] for s in samples] == ["gsm8k-train-0", "gsm8k-train-5"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "Skipped 4 of 6" in message and str(path) in message
    assert "line 2: missing 'question'" in message  # a JSONL file's rows are named by line
    assert "line 3: empty 'answer'" in message
    assert "line 4: answer has no parsable" in message and "line 5" in message


def test_bad_rows_strict_raises_with_index(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", BAD_ROWS)
    with pytest.raises(ValueError, match=rf"{path}: bad line 2: missing 'question'"):
        load_gsm8k(str(path), "train", strict=True)


def test_malformed_jsonl_lines_are_counted_with_line_numbers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One broken line used to abort the whole load with an Arrow error and no line number."""
    lines = [json.dumps(ROWS[0]), '{"question": "Q?", "answer": "#### 1"', "", "[1, 2]",
             json.dumps(ROWS[1])]  # fmt: skip
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="core.data.gsm8k"):
        samples = load_gsm8k(str(path), "train")
    assert [s["id"] for s in samples] == ["gsm8k-train-0", "gsm8k-train-4"]  # ids by line
    (record,) = caplog.records
    message = record.getMessage()
    assert "Skipped 2 of 4 rows" in message
    assert "line 2: invalid JSON" in message and "line 4: a JSON list, not an object" in message
    with pytest.raises(ValueError, match=rf"{path}: bad line 2: invalid JSON"):
        load_gsm8k(str(path), "train", strict=True)


def test_validate_rows_lists_only_first_few(caplog: pytest.LogCaptureFixture) -> None:
    rows = [{"question": "Q", "answer": f"no number {i}"} for i in range(8)]
    rows += ["not a dict", {"question": "Q", "answer": 7}, ROWS[2]]
    with caplog.at_level(logging.WARNING, logger="core.data.gsm8k"):
        assert validate_rows(rows, "mem") == [ROWS[2]]
    (record,) = caplog.records
    message = record.getMessage()
    assert "Skipped 10 of 11 rows from mem" in message
    assert "row 4:" in message and "row 5:" not in message and "and 5 more" in message
    with pytest.raises(ValueError, match="mem: bad row 9: 'answer' is a int"):
        validate_rows([ROWS[0]] * 9 + [{"question": "Q", "answer": 7}], "mem", strict=True)


def test_a_line_of_invalid_utf8_is_skipped_and_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        json.dumps(ROWS[0]).encode() + b'\n{"question": "caf\xe9", "answer": "#### 1"}\n'
    )
    assert [s["id"] for s in load_gsm8k(str(path), "train")] == ["gsm8k-train-0"]
    with pytest.raises(
        ValueError, match=rf"{path}: bad line 2: not UTF-8 \(byte 0xe9 at byte 18\)"
    ):
        load_gsm8k(str(path), "train", strict=True)
