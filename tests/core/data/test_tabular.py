"""Any tabular dataset through a column mapping: JSONL/CSV/parquet/save_to_disk, any fsspec URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from core.config import ConfigError, load_config
from core.data.tabular import (
    ColumnError,
    Columns,
    load_table,
    remove_test_questions,
    split_by_ratio,
    to_samples,
)

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
ROWS = [
    {"uid": f"p{i}", "problem": f"What is {i}+1?", "solution": f"{i}+1={i + 1} #### {i + 1}",
     "level": i % 3, "persona": "You add numbers."}
    for i in range(12)
]  # fmt: skip
COLUMNS = Columns(prompt="problem", answer="solution", system="persona", id="uid",
                  metadata=("level",))  # fmt: skip


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_with_custom_columns(tmp_path: Path) -> None:
    rows, label = load_table(str(_jsonl(tmp_path / "d.jsonl", ROWS)), "train")
    samples = to_samples(rows, COLUMNS, label, "train")
    assert samples[3] == {"id": "p3", "question": "What is 3+1?", "answer": "3+1=4 #### 4",
                          "level": 0, "system": "You add numbers."}  # fmt: skip
    assert len(samples) == 12


def test_a_column_typo_names_the_columns_there_are(tmp_path: Path) -> None:
    rows, label = load_table(str(_jsonl(tmp_path / "d.jsonl", ROWS)), "train")
    with pytest.raises(ColumnError, match=r"data.answer_key='soluton'.*\['level', 'persona', "):
        to_samples(rows, Columns(prompt="problem", answer="soluton"), label, "train")


@pytest.mark.parametrize("kind", ["csv", "parquet", "folder", "save_to_disk"])
def test_other_formats(tmp_path: Path, kind: str) -> None:
    table = datasets.Dataset.from_list(ROWS)
    if kind == "csv":
        table.to_csv(str(tmp_path / "d.csv"))
        path = tmp_path / "d.csv"
    elif kind == "parquet":
        table.to_parquet(str(tmp_path / "d.parquet"))
        path = tmp_path / "d.parquet"
    elif kind == "folder":  # {split}.<ext> files
        table.to_parquet(str(tmp_path / "train.parquet"))
        _jsonl(tmp_path / "test.jsonl", ROWS[:2])
        path = tmp_path
    else:
        datasets.DatasetDict({"train": table, "test": table.select(range(2))}).save_to_disk(
            str(tmp_path / "dd")
        )
        path = tmp_path / "dd"
    rows, label = load_table(str(path), "train")
    assert [r["uid"] for r in rows] == [r["uid"] for r in ROWS]
    assert to_samples(rows, COLUMNS, label, "train")[5]["answer"] == "5+1=6 #### 6"
    if kind in ("folder", "save_to_disk"):
        assert len(load_table(str(path), "test")[0]) == 2


def test_missing_sources_and_splits_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset not found"):
        load_table(str(tmp_path / "absent.jsonl"), "train")
    _jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(FileNotFoundError, match=r"no validation.jsonl.*under"):
        load_table(str(tmp_path), "validation")


def test_ratio_split_and_test_questions_removed() -> None:
    samples = [{"id": str(i), "question": f"Q {i}", "answer": "#### 1"} for i in range(20)]
    train, test = split_by_ratio(samples, 0.25, seed=3)
    assert len(test) == 5 and len(train) == 15
    assert split_by_ratio(samples, 0.25, seed=3) == (train, test)  # deterministic per seed
    assert {s["id"] for s in train}.isdisjoint(s["id"] for s in test)
    leaked = [*train, {"id": "x", "question": "  q  99 ".upper(), "answer": "#### 1"}, test[0]]
    kept, removed = remove_test_questions(leaked, [*test, {"question": "Q 99"}])
    assert removed == 2 and kept == train


def test_prompts_over_the_token_limit_are_dropped_and_counted(tmp_path: Path) -> None:
    from core.data.prompting import Prompter
    from core.models import create_pretrained, load_tokenizer
    from core.runtime.stages import PreparedData, fit_prompts

    model_dir = create_pretrained("tiny", ["What is 1+1? 2"] * 5, tmp_path / "m", vocab_size=300,
                                  seed=1)  # fmt: skip
    samples = to_samples(ROWS, COLUMNS, "rows", "train")  # questions "What is 0+1?" .. "11+1?"
    prompter = Prompter(load_tokenizer(model_dir))
    limit = len(prompter.prompt_ids("What is 9+1?"))  # digits are single tokens: 10, 11 are longer
    cfg = load_config(QUICKSTART, [f"data.max_prompt_tokens={limit}"])
    data = PreparedData(samples, samples[:11], "train.jsonl", "test.jsonl", notes={"x": 1})
    fitted = fit_prompts(cfg, data, str(model_dir))
    assert [s["id"] for s in fitted.train] == [f"p{i}" for i in range(10)]
    assert fitted.notes == {"x": 1, "prompts_over_max_tokens_dropped": {"train": 2, "test": 1}}


@pytest.mark.integration
def test_jsonl_on_s3(s3_client: Any, s3_bucket: str, s3_storage_options: dict) -> None:
    body = "".join(json.dumps(r) + "\n" for r in ROWS)
    s3_client.put_object(Bucket=s3_bucket, Key="data/train.jsonl", Body=body.encode())
    rows, label = load_table(f"s3://{s3_bucket}/data", "train", s3_storage_options)
    assert label == f"s3://{s3_bucket}/data/train.jsonl"
    assert len(to_samples(rows, COLUMNS, label, "train")) == 12


@pytest.mark.e2e
def test_a_run_on_a_jsonl_dataset_with_its_own_column_names(tmp_path: Path) -> None:
    from core.runtime.job import run_experiment

    _jsonl(tmp_path / "data" / "train.jsonl", ROWS * 4)
    _jsonl(tmp_path / "data" / "eval.jsonl", ROWS[:4])
    base = [f"cluster.fileroot={tmp_path}", "data.source=dataset", f"data.path={tmp_path}/data",
            "data.test_split=eval", "data.prompt_key=problem", "data.answer_key=solution",
            "data.id_key=uid", "data.max_prompt_tokens=200", "sft.steps=20",
            "learner.total_steps=2", "rollout.batch_size=2", "algorithm.group_size=2",
            "eval.every_n_steps=0", "checkpoint.every_n_steps=0"]  # fmt: skip
    summary = run_experiment(load_config(QUICKSTART, [*base, "experiment.trial=ok"]))
    assert summary["steps"] == 2
    # the eval questions are also in train (ROWS * 4 holds ROWS[:4]): removed, and counted
    assert summary["data"]["train_questions_in_test_removed"] == 16
    assert summary["data"]["n_train"] == 32 and summary["data"]["n_test"] == 4
    assert summary["data"]["prompts_over_max_tokens_dropped"] == {"train": 0, "test": 0}
    with pytest.raises(ConfigError, match=r"data.prompt_key='question'.*'problem'"):
        run_experiment(
            load_config(QUICKSTART, [*base, "experiment.trial=typo", "data.prompt_key=question"])
        )


def test_a_missing_local_data_path_fails_at_config_time(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.path='.*absent.jsonl': no such file"):
        load_config(QUICKSTART, ["data.source=dataset", f"data.path={tmp_path}/absent.jsonl"])
    with pytest.raises(ConfigError, match=r"data.gsm8k_path='.*nope': no such file"):
        load_config(QUICKSTART, ["data.source=gsm8k", f"data.gsm8k_path={tmp_path}/nope"])
    hub = load_config(QUICKSTART, ["data.source=dataset", "data.path=openai/gsm8k"])
    assert hub.data.path == "openai/gsm8k"  # a hub id: checked by the loader, not here


def test_a_line_of_invalid_utf8_is_named_by_file_and_line(tmp_path: Path) -> None:
    """It used to abort the load with a bare UnicodeDecodeError naming neither."""
    path = _jsonl(tmp_path / "d.jsonl", ROWS[:4])
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(
        b"".join([*lines[:2], b'{"problem": "caf\xe9?", "solution": "1"}\n', *lines[2:]])
    )
    rows, _ = load_table(str(path), "train")  # JSONL: the line is skipped, the rest kept
    assert [r["uid"] for r in rows] == ["p0", "p1", "p2", "p3"]
    csv = tmp_path / "d.csv"
    csv.write_bytes(b"problem,solution\nWhat is 1+1?,#### 2\nCaf\xe9?,#### 1\n")
    with pytest.raises(ValueError, match=rf"{csv}: line 3 is not UTF-8 \(byte 0xe9 at byte 4\)"):
        load_table(str(csv), "train")
