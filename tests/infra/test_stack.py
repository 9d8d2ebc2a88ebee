"""infra.stack: one real stack (moto, Prefect, MLflow) on free ports for the whole module."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import mlflow
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from core.training.distributed import free_ports
from infra.stack import StackError, StackInfo, stack_down, stack_status, stack_up

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    state_dir = tmp_path_factory.mktemp("stack")
    prefect, mlflow_port, s3 = free_ports(3)
    info = stack_up(
        state_dir, prefect_port=prefect, mlflow_port=mlflow_port, s3_port=s3, bucket="asyncrl-test"
    )
    try:
        yield info
    finally:
        stack_down(state_dir)  # idempotent: the last test already did it


@pytest.fixture
def s3(stack: StackInfo) -> Any:  # a boto3 S3 client
    env = stack.env()
    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"])  # fmt: skip


def test_services_healthy(stack: StackInfo, s3: Any) -> None:
    services = stack.services
    assert set(services) == {"s3", "prefect", "mlflow"}
    assert _get(f"{services['prefect'].url}/api/health") == (200, "true")
    assert _get(f"{services['mlflow'].url}/health") == (200, "OK")
    assert "asyncrl-test" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    record = json.loads((Path(stack.state_dir) / "stack.json").read_text())
    assert {name: svc["pid"] for name, svc in record["services"].items()} == {
        n: s.pid for n, s in services.items()
    }
    for service in services.values():
        assert Path(service.log).is_file() and Path(service.log).parent.name == "logs"

    status = stack_status(Path(stack.state_dir))
    assert status["running"] is True
    for name, entry in status["services"].items():
        assert entry["alive"] and entry["healthy"], (name, entry)
        assert entry["url"] == services[name].url


def test_env(stack: StackInfo) -> None:
    env = stack.env()
    s = stack.services
    assert env["PREFECT_API_URL"] == f"http://127.0.0.1:{s['prefect'].port}/api"
    assert env["MLFLOW_TRACKING_URI"] == f"http://127.0.0.1:{s['mlflow'].port}"
    assert (
        env["AWS_ENDPOINT_URL"]
        == env["MLFLOW_S3_ENDPOINT_URL"]
        == f"http://127.0.0.1:{s['s3'].port}"
    )
    assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"] and env["AWS_DEFAULT_REGION"]
    assert env["ASYNCRL_FILEROOT"] == "s3://asyncrl-test/runs"
    assert stack.urls() == {
        "Prefect UI": f"http://127.0.0.1:{s['prefect'].port}",
        "MLflow UI": f"http://127.0.0.1:{s['mlflow'].port}",
        "S3 endpoint": f"http://127.0.0.1:{s['s3'].port}",
    }
    assert _get(stack.urls()["Prefect UI"])[0] == 200 and _get(stack.urls()["MLflow UI"])[0] == 200


def test_stack_up_prints_the_urls_and_the_environment(
    stack: StackInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`asyncrl stack up`'s output: the URLs to open as comments, so `eval "$(asyncrl stack
    up)"` still works, then the exports. (The module's running stack stands in for a second
    one: the command's default ports may be taken on a shared machine.)"""
    import infra.stack
    from flows.cli import app

    monkeypatch.setattr(infra.stack, "stack_up", lambda state_dir: stack)
    result = CliRunner().invoke(app, ["stack", "up", "--state-dir", stack.state_dir])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(line.startswith(("# ", "export ")) for line in lines), lines
    for name, url in stack.urls().items():
        assert any(line.startswith(f"# {name}:") and line.endswith(url) for line in lines), name
    assert f"export MLFLOW_TRACKING_URI={stack.env()['MLFLOW_TRACKING_URI']}" in lines
    assert "export ASYNCRL_FILEROOT=s3://asyncrl-test/runs" in lines


def test_refuses_second_stack(stack: StackInfo, tmp_path: Path) -> None:
    s = stack.services
    with pytest.raises(StackError, match="already running"):
        stack_up(Path(stack.state_dir), prefect_port=s["prefect"].port, mlflow_port=s["mlflow"].port,
                 s3_port=s["s3"].port)  # fmt: skip
    with pytest.raises(StackError, match="already in use.*mlflow port"):
        stack_up(tmp_path / "other", prefect_port=free_ports(1)[0], mlflow_port=s["mlflow"].port,
                 s3_port=free_ports(1)[0])  # fmt: skip
    assert not (tmp_path / "other" / "stack.json").exists()


def test_mlflow_artifacts_land_in_bucket(stack: StackInfo, s3: Any, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    env = stack.env()
    # 1. A plain client: artifacts are proxied by the server to s3://bucket/mlartifacts.
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment_id = client.create_experiment("stack-test")
    run = client.create_run(experiment_id, run_name="proxied")
    client.log_text(run.info.run_id, "hello", "notes/hello.txt")
    client.set_terminated(run.info.run_id)
    keys = [
        o["Key"]
        for o in s3.list_objects_v2(Bucket="asyncrl-test", Prefix="mlartifacts/").get(
            "Contents", []
        )
    ]
    assert f"mlartifacts/{experiment_id}/{run.info.run_id}/artifacts/notes/hello.txt" in keys

    # 2. tasks.mlflow_tracking with the stack's environment and an s3:// fileroot: the experiment's
    # artifact location is {fileroot}/mlartifacts, written straight to the bucket.
    from core.config import load_config
    from tasks.mlflow_tracking import start_run

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # The exported environment alone sends the run there: no fileroot or tracking overrides.
    config = load_config(REPO / "experiments" / "quickstart.yaml",
                         ["experiment.name=stack-quickstart", "experiment.trial=t1"])  # fmt: skip
    assert config.cluster.fileroot == env["ASYNCRL_FILEROOT"] == "s3://asyncrl-test/runs"
    assert config.tracking.mlflow_uri == ""
    try:
        with start_run(config, run_name="tracked") as active:
            run_id = active.info.run_id
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]
    body = s3.get_object(
        Bucket="asyncrl-test", Key=f"runs/mlartifacts/{run_id}/artifacts/config.yaml"
    )["Body"].read()
    assert b"max_staleness: 4" in body
    assert client.get_run(run_id).data.tags["algorithm"] == "grpo"


def test_down_stops_everything(stack: StackInfo) -> None:
    state_dir = Path(stack.state_dir)
    pids = [s.pid for s in stack.services.values()]
    stack_down(state_dir)
    assert all(_gone(pid) for pid in pids)
    assert not (state_dir / "stack.json").exists()
    stack_down(state_dir)  # idempotent
    assert stack_status(state_dir) == {
        "running": False,
        "state_dir": str(state_dir),
        "services": {},
    }


def test_failed_start_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import infra.stack as stack_module

    broken = tmp_path / "prefect"
    broken.write_text("#!/bin/sh\necho 'boom: cannot start'\nexit 3\n")
    broken.chmod(0o755)
    real = stack_module._executable
    monkeypatch.setattr(
        stack_module, "_executable", lambda name: str(broken) if name == "prefect" else real(name)
    )
    spawned: list[int] = []
    real_spawn = stack_module._spawn

    def spawn(*args: Any) -> Any:
        service = real_spawn(*args)
        spawned.append(service.pid)
        return service

    monkeypatch.setattr(stack_module, "_spawn", spawn)
    state_dir = tmp_path / "state"
    prefect, mlflow_port, s3 = free_ports(3)
    with pytest.raises(
        StackError, match=r"prefect exited during start-up(.|\n)*boom: cannot start"
    ):
        stack_up(state_dir, prefect_port=prefect, mlflow_port=mlflow_port, s3_port=s3, timeout_s=60)
    assert not (state_dir / "stack.json").exists()
    log = (state_dir / "logs" / "s3.log").read_text()
    assert "moto_server" in log
    assert len(spawned) == 3
    # All stopped again. A group's orphaned children vanish when init reaps them: allow a moment.
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in spawned) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(pid) for pid in spawned), [p for p in spawned if not _gone(p)]
