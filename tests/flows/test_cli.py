"""The `asyncrl` command line: config errors exit 2 before work starts; `run` writes a summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.progress import LineProgress

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
runner = CliRunner()
# What `asyncrl stack up` exports: a test run must not follow a developer's shell to the stack.
STACK_VARS = ("MLFLOW_TRACKING_URI", "ASYNCRL_FILEROOT", "ASYNCRL_PROGRESS_INTERVAL_S")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STACK_VARS}
    return {**env, "COLUMNS": "120", **extra}


SMALL = [
    "data.n_train=200",
    "data.n_test=40",
    "eval.n_problems=40",
    "eval.max_new_tokens=8",
    "sft.steps=5",
    "learner.total_steps=2",
    "rollout.batch_size=4",
    "algorithm.group_size=2",
    "sampling.max_new_tokens=8",
    "eval.every_n_steps=0",
    "checkpoint.every_n_steps=0",
]


@pytest.mark.unit
def test_unknown_key_exits_2_naming_the_key(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["run", QUICKSTART, "rollout.max_stalenes=3", f"cluster.fileroot={tmp_path}"]
    )
    assert result.exit_code == 2
    assert "rollout.max_stalenes" in result.output and "rollout.max_staleness" in result.output
    assert not any(tmp_path.iterdir())  # nothing was started or written


@pytest.mark.unit
def test_wrong_type_exits_2_naming_key_and_type() -> None:
    result = runner.invoke(app, ["config", "show", QUICKSTART, "eval.max_concurrent=many"])
    assert result.exit_code == 2
    assert "eval.max_concurrent" in result.output and "int" in result.output


@pytest.mark.unit
def test_config_show_prints_resolved_values() -> None:
    result = runner.invoke(
        app, ["config", "show", QUICKSTART, "rollout.max_staleness=0", "algorithm=dapo"]
    )
    assert result.exit_code == 0, result.output
    assert "max_staleness: 0" in result.output
    assert "name: dapo" in result.output


@pytest.mark.unit
def test_bench_rejects_an_unknown_benchmark() -> None:
    result = runner.invoke(app, ["bench", "nope"])
    assert result.exit_code == 2 and "async_vs_sync" in result.output
    assert "orchestration_overhead" in result.output and "_common" not in result.output


@pytest.mark.unit
def test_deploy_refuses_a_secret_in_its_overrides() -> None:
    """Deployment parameters live in Prefect's database: a secret must come from the env."""
    uri = "tracking.mlflow_uri=http://me:Sentinel9pw@mlflow:5000"
    result = runner.invoke(app, ["deploy", "--config", QUICKSTART, uri])
    assert result.exit_code == 2
    assert "Sentinel9pw" not in result.output and "${oc.env:NAME}" in result.output


def test_config_docs_lists_every_field() -> None:
    result = runner.invoke(app, ["config", "docs"])
    assert result.exit_code == 0
    assert "`rollout.max_staleness`" in result.output
    assert "`algorithm.eps_clip`" in result.output


@pytest.mark.e2e
def test_run_main_job_writes_summary(tmp_path: Path) -> None:
    """The real console script in a subprocess, as a user runs it — with secrets in a config
    value and in the environment that must reach no file it writes (run folder, MLflow's store
    and artifacts, Prefect's database). With stderr piped (a log file, CI) it draws no live
    bars but a progress line per running stage every ASYNCRL_PROGRESS_INTERVAL_S and at its
    end; it takes its fileroot from ASYNCRL_FILEROOT, as the config leaves it at its default,
    and says so."""
    exe = Path(sys.executable).parent / "asyncrl"
    secrets = ["Sentinel1pw/with/slashes", "Sentinel2tok", "Sentinel3env"]
    description = f"mirror s3://ak:{secrets[0]}@minio:9000/b?x-amz-security-token={secrets[1]}"
    proc = subprocess.run(
        [str(exe), "run", QUICKSTART, "experiment.trial=t", f"experiment.description={description}",
         *SMALL, "sft.steps=12"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=_env(PREFECT_HOME=str(tmp_path / "prefect"), AWS_SECRET_ACCESS_KEY=secrets[2],
                 HF_TOKEN=secrets[2], ASYNCRL_FILEROOT=str(tmp_path),
                 ASYNCRL_PROGRESS_INTERVAL_S="0.5"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    running = [x for x in lines if re.fullmatch(r"sft_warm_start \d+/12 \([\d.]+/s, ETA .+\)", x)]
    assert len(running) >= 2, proc.stderr[-3000:]
    assert any(re.fullmatch(r"sft_warm_start 12/12 \([\d.]+/s, done in .+ s\)", x) for x in lines)
    assert any(re.fullmatch(r"rl_train 2/2 \([\d.]+/s, done in .+ s\)", x) for x in lines)
    assert "━" not in proc.stderr  # no bar drawn into a file
    assert not (tmp_path / "runs").exists()
    assert "from ASYNCRL_FILEROOT" in " ".join(proc.stderr.split())
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "prefect.db" for p in written) and (tmp_path / "mlflow.db").exists()
    leaks = [(p, s) for p in written for s in secrets if s.encode() in p.read_bytes()]
    assert leaks == []
    assert secrets[0] not in proc.stdout + proc.stderr
    assert "accuracy before RL" in proc.stdout and "accuracy after RL" in proc.stdout
    run_dir = tmp_path / "quickstart" / "t"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evals"][0]["n"] == 40 and summary["evals"][0]["version"] == 0
    assert summary["evals"][-1]["version"] == 2 == summary["steps"]
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert summary["data"]["n_train"] == 200
    assert summary["sft_final_loss"] is not None
    for name in (
        "config.yaml",
        "model_init/config.json",
        "sft/config.json",
        "final/model.safetensors",
        "metrics.jsonl",
        "batches.jsonl",
    ):
        assert (run_dir / name).exists(), name
    assert len(Path(summary["data"]["test_url"]).read_text().splitlines()) == 40
    # it ran as a Prefect flow tracked in MLflow (embedded store under the fileroot)
    assert summary["prefect_flow_run_id"] and summary["mlflow_run_id"]
    assert (tmp_path / "mlflow.db").exists()
    assert f"MLflow run: {summary['mlflow_run_id']}" in proc.stdout
    # the asynchrony timeline is an artifact of the MLflow run
    assert [p.name for p in tmp_path.rglob("timeline/timeline.png") if "mlartifacts" in str(p)]


@pytest.mark.unit
def test_line_progress_reports_every_interval_and_at_each_stage_end() -> None:
    lines: list[str] = []
    with LineProgress(lines.append, interval_s=0.1) as progress:
        progress.start("prepare_data", None)
        advance = progress.start("sft_warm_start", 10)  # ends prepare_data
        for _ in range(10):
            time.sleep(0.03)
            advance(1)  # the tenth ends the stage
        advance = progress.start("rl_train", 4)
        advance(1)  # the run stops early: the display closes
    assert re.fullmatch(r"prepare_data done in [\d.]+ s", lines[0])
    running = [line for line in lines if "ETA" in line]
    assert len(running) >= 2 and all(line.startswith("sft_warm_start ") for line in running)
    assert all(re.fullmatch(r"sft_warm_start \d+/10 \(\d+\.\d/s, ETA .+ s\)", x) for x in running)
    assert re.fullmatch(r"sft_warm_start 10/10 \(\d+\.\d/s, done in [\d.]+ s\)", lines[-2])
    assert re.fullmatch(r"rl_train 1/4 \(\d+\.\d/s, stopped after [\d.]+ s\)", lines[-1])


@pytest.mark.integration
def test_engine_serve_speaks_sglang_protocol(tmp_path: Path) -> None:
    import httpx

    from core.models import create_pretrained
    from core.training.distributed import free_port
    from tests.servers import wait_healthy

    model = create_pretrained(
        "tiny", ["Question: 1+1?\nAnswer: #### 2"] * 20, tmp_path / "m", vocab_size=300, seed=0
    )
    port = free_port()
    exe = Path(sys.executable).parent / "asyncrl"
    proc = subprocess.Popen(
        [str(exe), "engine", "serve", "--model", str(model), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/health", proc, lambda: proc.stderr.read().decode())
        reply = httpx.post(
            f"{url}/generate",
            json={
                "input_ids": [5, 6, 7],
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "stop_token_ids": []},
            },
            timeout=60,
        ).json()
        assert len(reply["output_ids"]) == 6
        assert reply["meta_info"]["finish_reason"]["type"] == "length"
        assert [t[1] for t in reply["meta_info"]["output_token_logprobs"]] == reply["output_ids"]
        info = httpx.get(f"{url}/get_model_info", timeout=5).json()
        assert info["model_path"] == str(model)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.unit
def test_engine_serve_rejects_a_folder_without_a_model(tmp_path: Path) -> None:
    result = runner.invoke(app, ["engine", "serve", "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert str(tmp_path) in result.output and "config.json" in result.output


@pytest.mark.unit
def test_the_summary_table_without_a_starting_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    """eval.at_start=false: no accuracy before RL, and the task's metrics show only their end."""
    import io

    from rich.console import Console

    import flows.cli as cli

    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=200))
    final = {"version": 2, "accuracy": 0.25, "metrics": {"direct_share": 0.5}, "sampled": {}}
    cli._print_summary({
        "experiment": "e", "trial": "t", "data": {"n_test": 8}, "accuracy_before": None,
        "accuracy_after": 0.25, "evals": [final], "steps": 2, "wall_seconds": 1.0, "run_dir": "r",
    })  # fmt: skip
    text = out.getvalue()
    assert re.search(r"accuracy before RL\s*│\s*—", text) and re.search(
        r"after RL\s*│\s*0\.250", text
    )
    assert re.search(r"direct_share before → after\s*│\s*— → 0\.500", text)
