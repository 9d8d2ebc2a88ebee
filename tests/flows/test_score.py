"""``asyncrl eval --task humaneval --completions``: a file of completions scored without a model."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from core.data.humaneval import load_problems
from flows.cli import app

runner = CliRunner()


def _text(output: str) -> str:
    """The output as one line: rich wraps long messages at the terminal's width."""
    return " ".join(output.split())


def test_scoring_a_completions_file_prints_pass_at_k_and_writes_results(tmp_path: Path) -> None:
    problems = load_problems()
    ids = ["HumanEval/0", "HumanEval/2", "HumanEval/7"]
    lines = []
    for task_id in ids:  # per problem: the canonical solution, then a wrong one
        lines.append({"task_id": task_id, "completion": problems[task_id].canonical_solution})
        lines.append({"task_id": task_id, "completion": "    return None\n"})
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = runner.invoke(app, ["eval", "--completions", str(samples), "--k", "1", "--k", "2",
                                 "--k", "10", "--workers", "2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "0.5000" in result.output and "1.0000" in result.output  # pass@1, pass@2
    assert "pass@10 need more samples per problem (fewest: 2)" in _text(result.output)
    assert "161 of 164 problems have no completion" in _text(result.output)
    rows = [json.loads(x) for x in Path(f"{samples}_results.jsonl").read_text().splitlines()]
    assert [r["passed"] for r in rows] == [True, False] * 3
    assert [r["task_id"] for r in rows] == [line["task_id"] for line in lines]
    summary = json.loads(Path(f"{samples}_summary.json").read_text())
    assert summary["pass_at_k"] == {"pass@1": 0.5, "pass@2": 1.0}
    assert summary["per_problem"]["HumanEval/2"] == {"n": 2, "passed": 1}
    assert summary["outcomes"] == {"passed": 3, "failed": 3}


def test_a_bad_line_or_option_exits_2_naming_it_and_writes_nothing(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"task_id": "HumanEval/0", "completion": "    pass\\n"}\n{"task_id": 3}\n')
    result = runner.invoke(app, ["eval", "--completions", str(samples)])
    assert result.exit_code == 2
    assert "samples.jsonl:2: missing or non-string field(s)" in _text(result.output)
    assert not Path(f"{samples}_results.jsonl").exists()
    result = runner.invoke(app, ["eval", "--task", "mbpp", "--completions", str(samples)])
    assert result.exit_code == 2 and "--task 'mbpp' is not one of ['humaneval']" in _text(
        result.output
    )
    missing = runner.invoke(app, ["eval", "--completions", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "completions file not found" in _text(missing.output)
