"""tasks.mlflow_tracking against real MLflow stores: embedded sqlite under tmp_path, and S3 on moto."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from core.config import Config, load_config
from tasks import mlflow_tracking as tracking
from tasks.mlflow_tracking import MLflowSink, log_summary, start_run

REPO = Path(__file__).resolve().parents[2]
SECRET = "hunter2-Zq9"


@pytest.fixture(autouse=True)
def _restore_mlflow_uri(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # start_run sets the process-wide tracking URI (and MLFLOW_TRACKING_URI): undo it per test.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    mlflow.set_tracking_uri(None)  # type: ignore[arg-type]


@pytest.fixture
def config(tmp_path: Path) -> Config:
    cfg = load_config(REPO / "experiments" / "quickstart.yaml")
    cfg.cluster.fileroot = str(tmp_path / "runs")
    cfg.experiment.trial = "t1"
    return cfg


def _client(config: Config) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking.tracking_uri(config))


def test_locations(config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "runs"
    assert tracking.tracking_uri(config) == f"sqlite:///{root}/mlflow.db"
    assert tracking.artifact_location(config) == f"file://{root}/mlartifacts"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config.cluster.fileroot = "s3://bucket/runs/"
    uri = tracking.tracking_uri(config)
    assert uri.startswith(f"sqlite:///{tmp_path}/cache/asyncrl/mlflow/") and uri.endswith(
        "/mlflow.db"
    )
    config.cluster.fileroot = "s3://bucket/runs"  # a trailing slash names the same root
    assert tracking.tracking_uri(config) == uri
    config.cluster.fileroot = "s3://other/runs"
    assert tracking.tracking_uri(config) != uri
    assert tracking.artifact_location(config) == "s3://other/runs/mlartifacts"

    config.tracking.mlflow_uri = "http://127.0.0.1:5000"
    assert tracking.tracking_uri(config) == "http://127.0.0.1:5000"


def _run_ids(uri: str) -> set[str]:
    """Every run in the store at ``uri``."""
    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_id for r in client.search_runs(experiments)} if experiments else set()


def test_mlflow_tracking_uri_from_the_environment_and_config_wins(
    config: Config,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With tracking.mlflow_uri empty the run goes to MLFLOW_TRACKING_URI (what `asyncrl stack
    up` exports), not the embedded store; an explicit tracking.mlflow_uri still wins."""
    env_uri = f"sqlite:///{tmp_path}/env-store/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env_uri)
    assert tracking.tracking_uri(config) == env_uri
    with caplog.at_level(logging.INFO, logger="tasks.mlflow_tracking"):
        with start_run(config, run_name="from-env") as run:
            from_env = run.info.run_id
            MLflowSink(from_env).log_metrics({"x": 1.0}, 0)
    assert _run_ids(env_uri) == {from_env}
    assert MlflowClient(tracking_uri=env_uri).get_run(from_env).data.metrics["x"] == 1.0
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # not the embedded store
    assert f"MLflow store {env_uri} (from MLFLOW_TRACKING_URI" in caplog.text
    assert os.environ["MLFLOW_TRACKING_URI"] == env_uri  # the user's value, left as it was

    explicit = f"sqlite:///{tmp_path}/explicit/mlflow.db"
    config.tracking.mlflow_uri = explicit
    with start_run(config, run_name="explicit") as run:
        chosen = run.info.run_id
    assert _run_ids(explicit) == {chosen} and _run_ids(env_uri) == {from_env}
    assert os.environ["MLFLOW_TRACKING_URI"] == env_uri


def test_runs_in_one_process_keep_their_own_embedded_stores(config: Config, tmp_path: Path) -> None:
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; start_run must not leave it set, or
    the next run (another fileroot) would take the first one's store for the user's choice."""
    with start_run(config) as run:
        first = run.info.run_id
    assert "MLFLOW_TRACKING_URI" not in os.environ
    other = load_config(REPO / "experiments" / "quickstart.yaml")
    other.cluster.fileroot = str(tmp_path / "other")
    other.experiment.trial = "t2"
    with start_run(other) as run:
        second = run.info.run_id
    assert _run_ids(tracking.tracking_uri(config)) == {first}
    assert _run_ids(f"sqlite:///{tmp_path}/other/mlflow.db") == {second}


def test_run_url_links_a_tracking_server_only() -> None:
    assert (
        tracking.run_url("http://127.0.0.1:5000", "3", "abc")
        == "http://127.0.0.1:5000/#/experiments/3/runs/abc"
    )
    # no credentials or query in a link shown to people and stored in Prefect
    assert (
        tracking.run_url("https://me:pw@mlflow.example.com/prefix/?token=t", "1", "r")
        == "https://mlflow.example.com/prefix/#/experiments/1/runs/r"
    )
    assert tracking.run_url("sqlite:////tmp/mlflow.db", "1", "r") is None
    assert tracking.run_url("databricks", "1", "r") is None


def test_start_run_params_tags_and_config_artifact(config: Config, tmp_path: Path) -> None:
    with start_run(config, run_name="quick", tags={"sweep": "s1"}) as run:
        run_id = run.info.run_id
        assert mlflow.active_run() is not None and mlflow.active_run().info.run_id == run_id
    assert mlflow.active_run() is None
    client = _client(config)
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == "quick"
    experiment = client.get_experiment(got.info.experiment_id)
    assert experiment.name == "quickstart"
    assert experiment.artifact_location == (tmp_path / "runs" / "mlartifacts").as_uri()
    params = got.data.params
    assert len(params) > 100  # more than one log_batch chunk
    assert params["rollout.max_staleness"] == "4"
    assert params["algorithm.name"] == "grpo"
    assert params["data.synthetic.operations"] == '["+", "-", "*"]'
    tags = got.data.tags
    assert tags["algorithm"] == "grpo" and tags["model"] == "tiny" and tags["max_staleness"] == "4"
    assert tags["experiment_trial"] == "t1" and tags["sweep"] == "s1"
    assert len(tags["git_commit"]) == 40 or tags["git_commit"] == "unknown"
    assert "prefect_flow_run_id" not in tags  # not inside a flow run
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert "config.yaml" in artifacts
    text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path / "dl"))).read_text()
    assert "max_staleness: 4" in text
    # Artifacts landed under {fileroot}/mlartifacts, nothing in the CWD.
    assert (tmp_path / "runs" / "mlartifacts" / run_id / "artifacts" / "config.yaml").is_file()


def test_secrets_never_logged(config: Config, tmp_path: Path) -> None:
    config.experiment.description = f"data at s3://u:{SECRET}@minio:9000/b"
    config.checkpoint.url = f"s3://ak:{SECRET}@host/ckpt"
    extra = {"aws_secret_access_key": SECRET, "db": f"postgresql://me:{SECRET}@db/x"}
    with start_run(config, tags=extra, params={"api_key": SECRET, "endpoint": "http://h:1"}) as run:
        run_id = run.info.run_id
    client = _client(config)
    got = client.get_run(run_id)
    everything = json.dumps([got.data.params, got.data.tags])
    text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path / "dl"))).read_text()
    assert SECRET not in everything and SECRET not in text
    assert got.data.params["api_key"] == "***" and got.data.tags["aws_secret_access_key"] == "***"
    assert got.data.tags["db"] == "postgresql://me:***@db/x"
    assert got.data.params["checkpoint.url"] == "s3://ak:***@host/ckpt"
    assert got.data.params["endpoint"] == "http://h:1"


def test_ensure_experiment_idempotent_and_restores(config: Config) -> None:
    experiment_id = tracking.ensure_experiment(config)
    assert tracking.ensure_experiment(config) == experiment_id
    client = _client(config)
    client.delete_experiment(experiment_id)
    assert tracking.ensure_experiment(config) == experiment_id
    assert client.get_experiment(experiment_id).lifecycle_stage == "active"
    config.tracking.mlflow_experiment = "other"
    assert tracking.ensure_experiment(config) != experiment_id


def test_sink_metric_history(config: Config) -> None:
    with start_run(config) as run:
        sink = MLflowSink(run.info.run_id)
        for step in range(5):
            sink.log_metrics(
                {
                    "reward/mean": 0.1 * step,
                    "eval/acc@1": 1.0 + step,
                    "bad/nan": math.nan,
                    "bad/inf": math.inf,
                    "bad/none": None,
                    "bad/str": "x",
                },
                step,
            )  # type: ignore[dict-item]
        sink.log_metrics({}, 5)
        assert sink.failures == 0
    client = _client(config)
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, round(m.value, 6)) for m in history] == [
        (s, round(0.1 * s, 6)) for s in range(5)
    ]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/acc_1")] == list(
        range(5)
    )
    assert not any(k.startswith("bad/") for k in client.get_run(run.info.run_id).data.metrics)


def test_sink_swallows_store_errors(config: Config) -> None:
    sink = MLflowSink("0" * 32, tracking_uri=tracking.tracking_uri(config))
    tracking.ensure_experiment(config)  # the store exists; the run does not
    sink.log_metrics({"x": 1.0}, 0)
    assert sink.failures == 1


def test_nested_runs(config: Config) -> None:
    with start_run(config, run_name="sweep") as parent:
        parent_id = parent.info.run_id
        with start_run(config, run_name="trial-0", parent_run_id=parent_id) as child:
            child_ids = [child.info.run_id]
    # A child started after the parent ended (as another process/task would) nests too.
    with start_run(config, run_name="trial-1", parent_run_id=parent_id) as child:
        child_ids.append(child.info.run_id)
    client = _client(config)
    for run_id in child_ids:
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == parent_id
    assert "mlflow.parentRunId" not in client.get_run(parent_id).data.tags


def test_log_summary(config: Config, tmp_path: Path) -> None:
    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    plot = tmp_path / "whatever.png"
    plot.write_bytes(b"\x89PNG fake")
    summary: dict[str, Any] = {
        "accuracy_after": 0.55, "accuracy_before": 0.41, "samples_per_s": 12.5, "steps": 40,
        "nan_value": math.nan, "ok": True, "evals": [{"accuracy": 0.41}], "algorithm": "grpo",
        "final_model_dir": str(model), "checkpoint_url": "s3://b/runs/q/t1/checkpoints",
    }  # fmt: skip
    with start_run(config) as run:
        log_summary(run.info.run_id, summary, {"plots/curves.png": plot})
    client = _client(config)
    got = client.get_run(run.info.run_id)
    assert got.data.metrics["final/accuracy_after"] == 0.55
    assert got.data.metrics["final/steps"] == 40
    assert not {"final/nan_value", "final/ok", "final/evals"} & set(got.data.metrics)
    assert got.data.tags["model_url"] == model.as_uri()  # a full URL, not a bare path
    assert got.data.tags["checkpoint_url"] == "s3://b/runs/q/t1/checkpoints"
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "plots", "model", "config.yaml"} <= top
    assert [a.path for a in client.list_artifacts(run.info.run_id, "plots")] == ["plots/curves.png"]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "model")} == {
        "model/config.json", "model/model.safetensors"}  # fmt: skip
    saved = json.loads(
        Path(
            client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path / "d"))
        ).read_text()
    )
    assert saved["accuracy_after"] == 0.55 and saved["evals"] == [{"accuracy": 0.41}]


def test_log_summary_large_model_is_url_only(
    config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "big"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\0" * 2000)
    monkeypatch.chdir(tmp_path)  # a relative local path becomes an absolute file:// URL
    summary = {"final_model_dir": str(model), "checkpoint_url": "runs/q/t1/checkpoints"}
    with start_run(config) as run:
        log_summary(run.info.run_id, summary, max_model_bytes=1000)
    client = _client(config)
    tags = client.get_run(run.info.run_id).data.tags
    assert tags["model_url"] == model.as_uri() == f"file://{model}"
    assert tags["checkpoint_url"] == f"file://{tmp_path}/runs/q/t1/checkpoints"
    assert "model" not in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_model_url_of_a_remote_run_names_the_uploaded_folder(config: Config) -> None:
    """A run on s3:// reports its model's local staging copy; the tag names the bucket's folder."""
    from core.storage import local_path

    run_dir = "s3://b/runs/quickstart/t1"
    summary = {"run_dir": run_dir, "final_model_dir": str(local_path(f"{run_dir}/final")),
               "checkpoint_url": f"{run_dir}/checkpoints"}  # fmt: skip
    with start_run(config) as run:
        log_summary(run.info.run_id, summary)
    tags = _client(config).get_run(run.info.run_id).data.tags
    assert tags["model_url"] == f"{run_dir}/final"
    assert tags["checkpoint_url"] == f"{run_dir}/checkpoints"


@pytest.mark.integration
def test_artifacts_land_in_s3(config: Config, tmp_path: Path, s3_endpoint: str, s3_bucket: str,
                              s3_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from tests.conftest import S3_KEY, S3_REGION, S3_SECRET

    for name, value in {"MLFLOW_S3_ENDPOINT_URL": s3_endpoint, "AWS_ENDPOINT_URL": s3_endpoint,
                        "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                        "AWS_DEFAULT_REGION": S3_REGION}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    config.cluster.fileroot = f"s3://{s3_bucket}/runs"
    config.tracking.mlflow_uri = f"sqlite:///{tmp_path}/store/mlflow.db"  # keep ~/.cache clean
    plot = tmp_path / "curves.png"
    plot.write_bytes(b"\x89PNG fake")
    with start_run(config) as run:
        log_summary(run.info.run_id, {"accuracy_after": 0.5}, {"curves.png": plot})
    prefix = f"runs/mlartifacts/{run.info.run_id}/artifacts/"
    listed = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix=prefix)
    keys = {obj["Key"].removeprefix(prefix) for obj in listed.get("Contents", [])}
    assert {"config.yaml", "summary.json", "curves.png"} <= keys
    body = (
        s3_client.get_object(Bucket=s3_bucket, Key=prefix + "config.yaml")["Body"].read().decode()
    )
    assert "max_staleness: 4" in body and SECRET not in body
