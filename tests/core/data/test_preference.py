"""Preference pairs: made from a task's worked solutions, or read from files and checked before
any work (missing columns named with the ones there are, malformed lines counted by number)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.data.preference import load_pairs, synthetic_pairs, task_pairs
from core.data.synthetic import SyntheticSpec, generate_splits
from core.data.tabular import ColumnError

pytestmark = pytest.mark.unit


def _dpo(tmp_path: Path, *overrides: str):
    return load_config(
        None, [f"cluster.fileroot={tmp_path}", "dpo.enabled=true", *overrides]
    ).preference


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_task_pairs_prefer_the_worked_solution_to_a_wrong_answer() -> None:
    train, test = generate_splits(SyntheticSpec(direct_fraction=0.5), 200, 50, seed=3)
    pairs = task_pairs(train, test, seed=3, source="synthetic")
    worked = [s for s in train if s["style"] == "worked"]
    assert len(pairs.train) == len(worked) and len(pairs.test) == len(test)  # test: all worked
    kinds = [p["rejected_kind"] for p in pairs.train]
    assert 0.3 < kinds.count("direct") / len(kinds) < 0.7
    for pair, sample in zip(pairs.train, worked, strict=True):
        assert pair["chosen"] == sample["answer"] and pair["question"] == sample["question"]
        working, right = sample["answer"].rsplit("\n#### ", 1)
        rejected_working, _, wrong = pair["rejected"].rpartition("#### ")
        assert 1 <= abs(int(wrong) - int(right)) <= 3
        if pair["rejected_kind"] == "direct":
            assert rejected_working == ""
        else:  # the same working up to its last calculation, which gives the wrong number
            head, _, last = working.rpartition("<<")
            expression = last.split("=")[0]
            assert rejected_working.startswith(f"{head}<<{expression}={wrong}>>{wrong}")
    assert task_pairs(train, test, seed=3, source="synthetic") == pairs  # deterministic
    assert task_pairs(train, test, seed=4, source="synthetic").train != pairs.train


def test_synthetic_pairs_need_worked_answers_ending_in_a_number() -> None:
    samples = [
        {"id": "a", "question": "q", "answer": "#### 5"},  # direct: nothing to prefer
        {"id": "b", "question": "q", "answer": "def f(): pass"},  # not a '#### N' answer
        {"id": "c", "question": "q", "answer": "2+3=5\n#### 5"},
    ]
    assert [p["id"] for p in synthetic_pairs(samples, 0, "train")] == ["c"]
    with pytest.raises(
        ValueError, match=r"preference.pairs=synthetic .*data.source='code_synthetic'"
    ):
        task_pairs(samples[:2], samples[:2], 0, "code_synthetic")


def test_a_missing_column_is_named_with_the_columns_there_are(tmp_path: Path) -> None:
    path = _write(tmp_path / "pairs.jsonl", [{"prompt": "p", "good": "a", "rejected": "b"}])
    with pytest.raises(
        ColumnError, match=r"preference.chosen_key='chosen'.*\['good', 'prompt', 'rejected'\]"
    ):
        load_pairs(_dpo(tmp_path, f"preference.pairs={path}"), seed=0)
    renamed = load_pairs(_dpo(tmp_path, f"preference.pairs={path}", "preference.chosen_key=good",
                              "preference.test_pairs=" + str(path)), seed=0)  # fmt: skip
    assert renamed.train == [{"id": "train-0", "question": "p", "chosen": "a", "rejected": "b"}]


def test_malformed_lines_and_unusable_rows_are_counted_and_skipped(tmp_path: Path) -> None:
    good = {"prompt": "2+2?", "chosen": "4", "rejected": "5"}
    chat = {"prompt": [{"role": "user", "content": "hi"}],
            "chosen": [{"role": "assistant", "content": "hello"}],
            "rejected": [{"role": "assistant", "content": "go away"}]}  # fmt: skip
    rows = [good, "{not json", chat, {**good, "chosen": ""}, {**good, "rejected": "4"},
            {**good, "chosen": 4}, {**chat, "chosen": [{"role": "user", "content": "x"}]},
            "[1, 2]", *[good] * 17]  # fmt: skip
    path = _write(tmp_path / "pairs.jsonl", rows)
    pairs = load_pairs(
        _dpo(tmp_path, f"preference.pairs={path}", "preference.test_ratio=0.2"), seed=0
    )
    assert pairs.notes["train_malformed_lines"] == {"count": 2, "first": ["line 2", "line 8"]}
    unusable = pairs.notes["train_unusable_pairs"]
    assert unusable["count"] == 4
    assert unusable["first"] == [
        "row 2: empty chosen",
        "row 3: chosen and rejected are the same",
        "row 4: chosen is int, not text or chat messages",
        "row 5: chosen has a turn that is not the assistant's",
    ]
    assert len(pairs.train) + len(pairs.test) == 19 and len(pairs.test) == 4  # 20 % held out
    assert chat["chosen"] in [p["chosen"] for p in pairs.train + pairs.test]


def test_held_out_pairs_from_a_file_or_a_folders_test_split(tmp_path: Path) -> None:
    row = {"prompt": "p", "chosen": "a", "rejected": "b"}
    folder = tmp_path / "prefs"
    folder.mkdir()
    _write(folder / "train.jsonl", [row] * 6)
    _write(folder / "test.jsonl", [{**row, "prompt": "held out"}] * 2)
    pairs = load_pairs(_dpo(tmp_path, f"preference.pairs={folder}"), seed=0)
    assert len(pairs.train) == 6 and [p["question"] for p in pairs.test] == ["held out"] * 2
    other = _write(tmp_path / "other.jsonl", [{**row, "prompt": "mine"}])
    pairs = load_pairs(
        _dpo(tmp_path, f"preference.pairs={folder}", f"preference.test_pairs={other}"), seed=0
    )
    assert [p["question"] for p in pairs.test] == ["mine"]
    empty = _write(tmp_path / "empty.jsonl", ["{bad"])
    with pytest.raises(ValueError, match=r"empty.jsonl: no readable rows \(1 malformed lines\)"):
        load_pairs(_dpo(tmp_path, f"preference.pairs={empty}"), seed=0)


def test_bad_dpo_settings_fail_when_the_config_loads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"dpo.loss='hinge' is not one of \['sigmoid', 'ipo'\]"):
        _dpo(tmp_path, "dpo.loss=hinge")
    with pytest.raises(ConfigError, match=r"preference.pairs='/nowhere/pairs.jsonl': no such file"):
        _dpo(tmp_path, "preference.pairs=/nowhere/pairs.jsonl")
    with pytest.raises(ConfigError, match=r"preference.test_pairs='./missing.jsonl': no such file"):
        _dpo(tmp_path, "preference.test_pairs=./missing.jsonl")
