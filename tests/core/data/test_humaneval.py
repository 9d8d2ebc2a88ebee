"""HumanEval: the package's problems, its verifier in our sandbox, the split, and bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.data.humaneval import (
    HumanEvalSpec,
    humaneval_splits,
    load_problems,
    read_completions,
    to_sample,
)
from core.evaluation import mean_pass_at_k
from core.rewards.humaneval import check, check_all, humaneval_pass

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "humaneval.yaml"


@pytest.fixture(scope="module")
def problems() -> dict:
    return load_problems()


def test_the_bundled_set_is_humanevals_164_problems(problems: dict) -> None:
    assert len(problems) == 164
    assert list(problems)[:2] == ["HumanEval/0", "HumanEval/1"]
    first = problems["HumanEval/0"]
    assert first.entry_point == "has_close_elements" and "def check(candidate)" in first.test


def test_every_canonical_solution_passes_and_broken_ones_fail(problems: dict) -> None:
    ids = list(problems)
    canonical = [{"task_id": t, "completion": problems[t].canonical_solution} for t in ids]
    empty = [{"task_id": t, "completion": "    pass\n"} for t in ids]
    # Each problem given the next problem's solution: well-formed code that solves another task.
    swapped = [
        {"task_id": t, "completion": problems[ids[(i + 1) % len(ids)]].canonical_solution}
        for i, t in enumerate(ids)
    ]
    results = check_all(problems, canonical + empty + swapped, workers=2)
    outcomes = [r["result"] for r in results]
    assert outcomes[:164] == ["passed"] * 164
    assert not any(r["passed"] for r in results[164:])
    assert set(outcomes[164:328]) == {"failed"}  # asserts on None fail; nothing raised elsewhere


def test_off_by_one_solutions_fail(problems: dict) -> None:
    truncate = problems["HumanEval/2"]  # truncate_number: the decimal part
    assert check(truncate, "    return number % 1.0\n") == "passed"
    assert check(truncate, "    return number // 1.0\n") == "failed"
    below = problems["HumanEval/3"]  # below_zero: does the balance ever drop below zero
    wrong = "    balance = 0\n    for op in operations:\n        balance += op\n        if balance <= 0:\n            return True\n    return False\n"
    assert check(below, wrong) == "failed"
    assert check(below, wrong.replace("<= 0", "< 0")) == "passed"


def test_a_chat_style_whole_function_replaces_the_prompts_stub(problems: dict) -> None:
    problem = problems["HumanEval/2"]
    fenced = "Sure:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```\nDone."
    assert check(problem, fenced) == "passed"
    bare = "def truncate_number(number: float) -> float:\n    return number - int(number)\n"
    assert check(problem, bare) == "passed"
    assert check(problem, "    while True:\n        pass\n", sandbox_timeout_s=1.0) == "timeout"
    assert check(problem, "    return (\n") == "syntax_error"


def test_the_reward_scores_a_sample_by_its_reference(problems: dict) -> None:
    sample = to_sample(problems["HumanEval/2"])
    assert sample["id"] == "HumanEval/2" and sample["question"].rstrip().endswith('"""')
    assert humaneval_pass(sample["solution"], sample["answer"]) == 1.0
    assert humaneval_pass("    return 0.0\n", sample["answer"]) == 0.0
    with pytest.raises(ValueError, match="prompt, test and entry_point"):
        humaneval_pass("x", json.dumps({"tests": ["assert True"]}))


def test_the_split_is_seeded_and_disjoint() -> None:
    spec = HumanEvalSpec(train_ratio=0.5)
    train, test = humaneval_splits(spec, 0, 0, seed=3)
    assert (len(train), len(test)) == (82, 82)
    assert not {s["id"] for s in train} & {s["id"] for s in test}
    again, _ = humaneval_splits(spec, 0, 0, seed=3)
    other, _ = humaneval_splits(spec, 0, 0, seed=4)
    assert [s["id"] for s in again] == [s["id"] for s in train]
    assert [s["id"] for s in other] != [s["id"] for s in train]
    train, test = humaneval_splits(HumanEvalSpec(), 0, 10, seed=3)
    assert train == [] and [s["id"] for s in test] == [f"HumanEval/{i}" for i in range(10)]


def test_a_file_in_humanevals_format_loads_gzipped_and_bad_lines_are_named(
    tmp_path: Path,
) -> None:
    row = {"task_id": "T/0", "prompt": "def f(x):\n", "test": "def check(c):\n    assert c(1) == 2\n",
           "entry_point": "f", "canonical_solution": "    return x + 1\n"}  # fmt: skip
    good = tmp_path / "mine.jsonl.gz"
    with gzip.open(good, "wt") as handle:
        handle.write(json.dumps(row) + "\n\n" + json.dumps({**row, "task_id": "T/1"}) + "\n")
    loaded = load_problems(str(good))
    assert (
        list(loaded) == ["T/0", "T/1"]
        and check(loaded["T/0"], row["canonical_solution"]) == "passed"
    )
    cases = {
        "missing.jsonl": json.dumps({k: v for k, v in row.items() if k != "test"}),
        "notjson.jsonl": json.dumps(row) + "\n{oops",
        "twice.jsonl": json.dumps(row) + "\n" + json.dumps(row),
    }
    messages = {
        "missing.jsonl": r"missing.jsonl:1: missing or non-string field\(s\) \['test'\]",
        "notjson.jsonl": r"notjson.jsonl:2: not JSON",
        "twice.jsonl": r"twice.jsonl:2: task_id 'T/0' appears twice",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=messages[name]):
            load_problems(str(tmp_path / name))
    with pytest.raises(FileNotFoundError, match="HumanEval problems file not found"):
        load_problems(str(tmp_path / "absent.jsonl"))


def test_a_completions_file_is_checked_before_anything_runs(tmp_path: Path, problems: dict) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_text(
        json.dumps({"task_id": "HumanEval/1", "completion": "x"}) + "\n"
        + json.dumps({"task_id": "HumanEval/1000", "completion": "x"}) + "\n"
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"samples.jsonl:2: task_id 'HumanEval/1000' is not a"):
        read_completions(str(path), problems)
    path.write_text(json.dumps({"task_id": "HumanEval/1"}))
    with pytest.raises(ValueError, match=r"samples.jsonl:1: .*\['completion'\]"):
        read_completions(str(path), problems)


def test_mean_pass_at_k_reports_only_ks_every_problem_has_samples_for() -> None:
    passed = {"a": [True, False, False, False], "b": [False, False]}
    result = mean_pass_at_k(passed, [1, 2, 4])
    assert set(result) == {1, 2}
    assert result[1] == pytest.approx((0.25 + 0.0) / 2)
    assert result[2] == pytest.approx((1 - 3 / 6 + 0.0) / 2)  # 1 - C(3,2)/C(4,2) for a


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.humaneval.train_ratio=0"], "train_ratio=0 holds every problem out"),
        (["data.humaneval.train_ratio=1"], "must be < 1"),
        (["data.humaneval.path=/nowhere/he.jsonl"], "data.humaneval.path='/nowhere/he.jsonl'"),
    ],
)
def test_bad_humaneval_settings_fail_at_load(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, overrides)


def test_an_evaluation_only_config_loads() -> None:
    cfg = load_config(
        RECIPE, ["data.humaneval.train_ratio=0", "sft.enabled=false", "learner.total_steps=0"]
    )
    assert cfg.data.source == "humaneval" and cfg.rollout.reward_fn.endswith(":humaneval_pass")
