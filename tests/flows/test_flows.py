"""The Prefect flows on the tiny config, under Prefect's test harness (a real, temporary API
server and database), with a real MLflow store and a real S3 endpoint for s3:// fileroots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import optuna
import pytest

from core.config import load_config
from tasks.mlflow_tracking import tracking_uri
from tests.core.runtime.helpers import read_scalars

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
TINY = [
    "data.n_train=120",
    "data.n_test=16",
    "eval.n_problems=16",
    "eval.max_new_tokens=8",
    "sft.steps=3",
    "rollout.batch_size=4",
    "algorithm.group_size=2",
    "sampling.max_new_tokens=8",
    "rollout.max_concurrent=16",
    "algorithm.overlong_buffer_len=4",
    "eval.every_n_steps=1",
    "checkpoint.every_n_steps=0",
    "learner.total_steps=2",
]


def client_for(fileroot: Path | str) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(
        tracking_uri(load_config(QUICKSTART, [f"cluster.fileroot={fileroot}"]))
    )


def test_experiment_flow_records_an_mlflow_run(harness: str, tmp_path: Path) -> None:
    from flows.experiment import experiment

    config = load_config(QUICKSTART, [*TINY, f"cluster.fileroot={tmp_path}", "experiment.trial=e1"])
    result = experiment(config)
    summary = result["summary"]
    assert result["mlflow_run_id"] == summary["mlflow_run_id"]
    assert summary["prefect_flow_run_id"]
    run = client_for(tmp_path).get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.max_staleness"] == "4"
    assert run.data.params["learner.total_steps"] == "2"
    assert run.data.tags["algorithm"] == "grpo" and run.data.tags["max_staleness"] == "4"
    assert run.data.tags["prefect_flow_run_id"] == summary["prefect_flow_run_id"]
    history = client_for(tmp_path).get_metric_history(run.info.run_id, "reward/mean")
    assert [m.step for m in history] == [0, 1]
    assert len(client_for(tmp_path).get_metric_history(run.info.run_id, "sft/loss")) == 3
    assert (
        len(client_for(tmp_path).get_metric_history(run.info.run_id, "eval/accuracy")) == 3
    )  # v0, v1, v2
    artifacts = {a.path for a in client_for(tmp_path).list_artifacts(run.info.run_id)}
    assert {"config.yaml", "summary.json"} <= artifacts
    on_disk = json.loads((tmp_path / "quickstart" / "e1" / "summary.json").read_text())
    assert on_disk["mlflow_run_id"] == result["mlflow_run_id"]
    assert on_disk["checkpoint_url"] == result["checkpoint_url"]
    # TensorBoard: the rows of metrics.jsonl (as float32), in the run folder and in MLflow
    run_dir = tmp_path / "quickstart" / "e1"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scalars = read_scalars(run_dir / "tensorboard")
    for key in ("sft/loss", "reward/mean", "eval/accuracy"):
        expected = [(r["step"], float(np.float32(r[key]))) for r in rows if r.get(key) is not None]
        assert scalars[key] == expected and expected, key
    assert scalars["reward/mean"] == [(m.step, float(np.float32(m.value))) for m in history]
    assert "tensorboard" in artifacts
    logged = [
        Path(a.path).name
        for a in client_for(tmp_path).list_artifacts(run.info.run_id, "tensorboard")
    ]
    assert len(logged) == 1 and logged[0].startswith("events.out.tfevents."), logged
    (tmp_path / "download").mkdir()
    copy = client_for(tmp_path).download_artifacts(
        run.info.run_id, "tensorboard", str(tmp_path / "download")
    )
    assert read_scalars(Path(copy)) == scalars


def test_ablate_command_parses_the_config_once_and_compares(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import core.config.loading as config_module
    from flows.cli import app

    reads: list[Path] = []
    read_yaml = config_module._read_yaml
    monkeypatch.setattr(config_module, "_read_yaml", lambda p: reads.append(p) or read_yaml(p))
    out = CliRunner().invoke(
        app,
        ["ablate", QUICKSTART, *TINY, f"cluster.fileroot={tmp_path}", "eval.every_n_steps=0",
         "experiment.trial=abl", "--algos", "grpo,dapo"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert reads == [Path(QUICKSTART)]  # 1 parse for 2 variants (it used to be 1 + 2N)
    result = json.loads((tmp_path / "quickstart" / "ablation-abl" / "summary.json").read_text())
    assert [row["algorithm"] for row in result["table"]] == ["grpo", "dapo"]
    assert Path(result["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    client = client_for(tmp_path)
    parent = client.get_run(result["mlflow_parent_run_id"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    assert sorted(r.data.tags["algorithm"] for r in children) == ["dapo", "grpo"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "curves.png",
        "comparison.md",
    }
    assert len(result["runs"]) == 2
    assert {r["algorithm"]: r["seed"] for r in result["runs"]} == {"grpo": 1, "dapo": 1}


def test_sweep_leaves_a_study_and_child_runs(harness: str, tmp_path: Path) -> None:
    from core.config import parse_config
    from flows.sweep import load_space, sweep

    space = tmp_path / "space.yaml"
    space.write_text(
        "params:\n  rollout.max_staleness: {type: categorical, choices: [0, 2]}\n"
        "  algorithm.lr: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}\n"
    )
    source = parse_config(QUICKSTART, [*TINY, f"cluster.fileroot={tmp_path}"])
    result = sweep(source, load_space(space, source), n_trials=2)
    study = optuna.load_study(study_name=result["study_name"], storage=result["storage"])
    assert len(study.trials) == 2
    states = {t.state for t in study.trials}
    assert states <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    client = client_for(tmp_path)
    parent = client.get_run(result["mlflow_parent_run_id"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    assert len(children) == 2
    assert {r.data.tags["optuna_state"] for r in children} == {t.state.name for t in study.trials}
    if result["best"] is not None:
        assert set(result["best"]["params"]) == {"rollout.max_staleness", "algorithm.lr"}


def test_s3_fileroot_puts_checkpoints_and_artifacts_in_the_bucket(
    harness: str,
    tmp_path: Path,
    s3_endpoint: str,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fsspec

    from flows.experiment import experiment

    for key, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "MLFLOW_S3_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": s3_storage_options["key"],
        "AWS_SECRET_ACCESS_KEY": s3_storage_options["secret"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    fsspec.filesystem("s3").clear_instance_cache()
    fileroot = f"s3://{s3_bucket}/runs"
    overrides = [
        *TINY,
        f"cluster.fileroot={fileroot}",
        "experiment.trial=s3",
        "checkpoint.every_n_steps=2",
        f"tracking.mlflow_uri=sqlite:///{tmp_path}/mlflow.db",
    ]
    result = experiment(load_config(QUICKSTART, overrides))
    fs = fsspec.filesystem("s3", **s3_storage_options)
    assert result["checkpoint_url"].startswith(f"s3://{s3_bucket}/")
    assert fs.exists(f"{s3_bucket}/runs/quickstart/s3/checkpoints/step-000002/COMMITTED")
    assert fs.exists(f"{s3_bucket}/runs/quickstart/s3/summary.json")
    artifacts = fs.find(f"{s3_bucket}/runs/mlartifacts")
    assert any(path.endswith("summary.json") for path in artifacts)
    assert any(path.endswith("config.yaml") for path in artifacts)
    assert fs.glob(f"{s3_bucket}/runs/quickstart/s3/tensorboard/events.out.tfevents.*")
    assert any("/tensorboard/events.out.tfevents." in path for path in artifacts)
