"""Deployments on a real Prefect server: registered with their schedule, and a run triggered the
way the UI does it (``POST /api/deployments/{id}/create_flow_run`` with edited parameters)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from core.training.distributed import free_port
from flows.cli import app
from flows.deploy import deployments
from tests.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
BIN = Path(sys.executable).parent


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def prefect_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, str]]]:
    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(f"{url}/health", proc, (home / "server.log").read_text)
        yield url, {**env, "PREFECT_API_URL": url, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    finally:
        _stop(proc)
        log.close()


def _api(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """A Prefect API call as Prefect's own client makes it: 503 means "retry" (the server's
    sqlite was busy, e.g. while the served deployments poll it on a loaded machine)."""
    for attempt in range(8):
        reply = httpx.request(method, url, timeout=10, **kwargs)
        if reply.status_code != 503:
            break
        time.sleep(0.5 * 2**attempt)
    reply.raise_for_status()
    return reply


def _deployments(url: str) -> dict[str, dict]:
    return {d["name"]: d for d in _api("POST", f"{url}/deployments/filter", json={}).json()}


@pytest.mark.unit
def test_the_nightly_schedule_names_its_time_zone() -> None:
    """Prefect's UI shows the zone beside the time: UTC unless --timezone says otherwise."""
    default = deployments(QUICKSTART, [], "0 2 * * *", ["grpo"], 1)
    berlin = deployments(QUICKSTART, [], "0 2 * * *", ["grpo"], 1, timezone="Europe/Berlin")
    for deployed, zone in ((default, "UTC"), (berlin, "Europe/Berlin")):
        experiment, nightly = deployed
        assert not experiment.schedules
        [schedule] = [s.schedule for s in nightly.schedules]
        assert (schedule.cron, schedule.timezone) == ("0 2 * * *", zone)


@pytest.mark.unit
def test_deploy_refuses_an_unknown_time_zone() -> None:
    result = CliRunner().invoke(app, ["deploy", "--config", QUICKSTART, "--timezone", "Mars/Base"])
    assert result.exit_code == 2
    assert "Mars/Base" in result.output and "IANA" in result.output


@pytest.mark.integration
def test_ui_trigger_runs_the_experiment_with_edited_parameters(
    prefect_server: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, env = prefect_server
    served = subprocess.Popen(
        [
            str(BIN / "asyncrl"),
            "deploy",
            "--config",
            QUICKSTART,
            "--cron",
            "0 2 * * *",
            "--timezone",
            "Europe/Berlin",
        ],  # fmt: skip
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not {"experiment", "nightly-ablation"} <= set(deployments := _deployments(url)):
            assert served.poll() is None, served.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "deployments were not registered"
            time.sleep(1)
        nightly = deployments["nightly-ablation"]
        crons = [
            (s["schedule"].get("cron"), s["schedule"].get("timezone")) for s in nightly["schedules"]
        ]
        assert crons == [("0 2 * * *", "Europe/Berlin")]
        assert deployments["experiment"]["parameters"]["config_path"] == QUICKSTART

        # What the UI's "Run" button sends, with the overrides edited by the user.
        overrides = [
            "data.n_train=120",
            "data.n_test=16",
            "eval.n_problems=16",
            "eval.max_new_tokens=8",
            "sft.steps=2",
            "rollout.batch_size=4",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=8",
            "eval.every_n_steps=0",
            "learner.total_steps=2",
            "rollout.max_staleness=1",
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=from-ui",
        ]
        created = _api(
            "POST",
            f"{url}/deployments/{deployments['experiment']['id']}/create_flow_run",
            json={"parameters": {"config_path": QUICKSTART, "overrides": overrides}},
        )
        run_id = created.json()["id"]
        deadline = time.monotonic() + 420
        while True:
            state = _api("GET", f"{url}/flow_runs/{run_id}").json()["state"]
            if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            assert served.poll() is None, served.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, f"flow run still {state['type']}"
            time.sleep(2)
        assert state["type"] == "COMPLETED", state
    finally:
        _stop(served)
    summary = json.loads((tmp_path / "quickstart" / "from-ui" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["max_staleness"] == 1  # the edited parameters applied
    assert summary["prefect_flow_run_id"] == run_id
