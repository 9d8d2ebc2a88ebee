"""Deployments on a real Prefect server: registered with their schedule, and a run triggered the
way the UI does it (``POST /api/deployments/{id}/create_flow_run`` with edited parameters)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prefect.exceptions import ParameterTypeError
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.utilities.callables import parameter_schema
from typer.testing import CliRunner

from core.algorithms.config import preset_names
from core.training.distributed import free_port
from flows.ablation import ablation_variants
from flows.cli import app
from flows.deploy import ablation_from_yaml, deployments, experiment_from_yaml
from flows.run_form import form_source, form_values
from tests.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
BIN = Path(sys.executable).parent
# A run of seconds: tiny data, 2 SFT steps, no periodic eval (RL steps and staleness set apart).
TINY = [
    "data.n_train=120",
    "data.n_test=16",
    "eval.n_problems=16",
    "eval.max_new_tokens=8",
    "sft.steps=2",
    "rollout.batch_size=4",
    "algorithm.group_size=2",
    "sampling.max_new_tokens=8",
    "eval.every_n_steps=0",
    "experiment.trial=from-ui",
]


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


def _wait_for_end(
    url: str, run_id: str, runner: subprocess.Popen, output: Callable[[], str], timeout_s: float
) -> dict:
    """The flow run's final state; fails with the runner's ``output()`` if it exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = _api("GET", f"{url}/flow_runs/{run_id}").json()["state"]
        if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return state
        assert runner.poll() is None, output()[-3000:]
        assert time.monotonic() < deadline, f"flow run still {state['type']}"
        time.sleep(2)


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


# --- The typed run form --------------------------------------------------------------------------

FORM_FIELDS = ["max_staleness", "total_steps", "lr", "seed", "fileroot"]


@pytest.mark.unit
def test_the_run_form_is_typed_and_described() -> None:
    """What Prefect's UI builds its run form from: a choice of presets, numbers with bounds,
    a title and a description on every field, and nothing but the user's parameters."""
    experiment = parameter_schema(experiment_from_yaml).model_dump_for_openapi()["properties"]
    ablation = parameter_schema(ablation_from_yaml).model_dump_for_openapi()["properties"]
    assert list(experiment) == ["config_path", "algorithm", *FORM_FIELDS, "overrides"]
    assert list(ablation) == [
        "config_path", "algorithms", "seeds", "parallel", *FORM_FIELDS, "overrides",
    ]  # fmt: skip

    def typed(prop: dict) -> dict:
        """The field's type when given: None (null) means "as in the config file"."""
        assert prop["anyOf"][1] == {"type": "null"} and prop["default"] is None
        return prop["anyOf"][0]

    assert typed(experiment["algorithm"]) == {"enum": preset_names(), "type": "string"}
    assert typed(ablation["algorithms"])["items"]["enum"] == preset_names()
    fields = [typed(experiment[name]) for name in FORM_FIELDS]
    assert [field["type"] for field in fields] == [
        "integer",
        "integer",
        "number",
        "integer",
        "string",
    ]
    assert fields[0]["minimum"] == fields[1]["minimum"] == fields[2]["exclusiveMinimum"] == 0
    assert typed(experiment["overrides"]) == {"items": {"type": "string"}, "type": "array"}
    assert ablation["seeds"]["minimum"] == 1
    assert ablation["parallel"]["pattern"] == "^(auto|[1-9][0-9]*)$"
    for name, prop in [*experiment.items(), *ablation.items()]:
        assert prop["title"] != name and len(prop["description"]) > 20, name
    assert "rollout.max_staleness" in experiment["max_staleness"]["description"]
    assert "docs/config.md" in experiment["overrides"]["description"]
    for deployment in deployments(QUICKSTART, [], "0 2 * * *", ["grpo"], 1):
        assert "docs/config.md" in deployment.description


@pytest.mark.unit
def test_typed_fields_reach_the_resolved_config(tmp_path: Path) -> None:
    values = form_values(
        algorithm="dr_grpo", max_staleness=1, total_steps=3, lr=1e-5, seed=7, fileroot=str(tmp_path)
    )
    config = form_source(QUICKSTART, ["rollout.batch_size=4"], values).resolve()
    assert config.algorithm.name == "dr_grpo"
    assert config.algorithm.loss_aggregation == "seq-mean-token-sum-norm"  # the preset applied
    assert config.algorithm.group_size == 8  # ... and the file's algorithm.* keys on top of it
    assert (config.rollout.max_staleness, config.learner.total_steps) == (1, 3)
    assert (config.algorithm.lr, config.experiment.seed) == (1e-5, 7)
    assert config.cluster.fileroot == str(tmp_path)
    assert config.rollout.batch_size == 4  # the free override
    untouched = form_source(QUICKSTART, [], form_values(seed=None)).resolve()
    assert (untouched.rollout.max_staleness, untouched.algorithm.lr) == (4, 2e-4)  # the file's


@pytest.mark.unit
def test_typed_fields_hold_in_every_ablation_variant() -> None:
    """The ablation's variants pick the preset and seed on top: the form's lr and η stay, and
    the seeds count up from the form's seed."""
    source = form_source(QUICKSTART, [], form_values(max_staleness=0, lr=3e-5, seed=5))
    variants = ablation_variants(source, ["grpo", "ppo"], seeds=2)
    assert [(v.algorithm.name, v.experiment.seed) for v in variants] == [
        ("grpo", 5), ("grpo", 6), ("ppo", 5), ("ppo", 6),
    ]  # fmt: skip
    assert {(v.algorithm.lr, v.rollout.max_staleness) for v in variants} == {(3e-5, 0)}


@pytest.mark.unit
def test_dpo_is_an_ablation_variant_beside_the_rl_presets() -> None:
    """``dpo`` runs the recipe's DPO stage without RL; an RL preset runs without DPO; both keep
    the recipe's data and warm start, and the runs are named and tagged by what trains."""
    source = form_source(str(ROOT / "experiments" / "dpo_quickstart.yaml"),
                         ["learner.total_steps=40"], form_values())  # fmt: skip
    dpo, grpo = ablation_variants(source, ["dpo", "grpo"], seeds=1)
    assert (dpo.dpo.enabled, dpo.learner.total_steps, dpo.method) == (True, 0, "dpo")
    assert (grpo.dpo.enabled, grpo.learner.total_steps, grpo.method) == (False, 40, "grpo")
    assert dpo.data == grpo.data and dpo.sft == grpo.sft and dpo.eval == grpo.eval


@pytest.mark.unit
@pytest.mark.parametrize(
    ("field", "override"),
    [
        ({"max_staleness": 2}, "rollout.max_staleness=3"),
        ({"algorithm": "ppo"}, "algorithm=dapo"),
        ({"algorithm": "ppo"}, "algorithm.name=dapo"),
        ({"lr": 1e-5}, "algorithm.lr = 1e-4"),
    ],
)
def test_a_typed_field_and_an_override_of_the_same_key_is_an_error(
    field: dict[str, Any], override: str
) -> None:
    [(name, _)] = field.items()
    with pytest.raises(ValueError, match=rf"invalid config: {name}=.* both set .*one place"):
        experiment_from_yaml.fn(config_path=QUICKSTART, overrides=[override], **field)


@pytest.mark.unit
def test_bad_form_values_fail_naming_the_field() -> None:
    """Prefect validates a flow run's parameters against the types before the flow starts."""
    ablation_only = {"seeds": 0}, {"parallel": "all"}
    for bad in ({"algorithm": "sgd"}, {"max_staleness": -1}, {"lr": 0}, *ablation_only):
        flow = ablation_from_yaml if bad in ablation_only else experiment_from_yaml
        with pytest.raises(ParameterTypeError, match=f" - {next(iter(bad))}:"):
            flow.validate_parameters(bad)
    with pytest.raises(ValueError, match="rollout.batch_size must be > 0"):  # config validation
        experiment_from_yaml.fn(config_path=QUICKSTART, overrides=["rollout.batch_size=0"])


# --- Deployments on a work pool ------------------------------------------------------------------


@pytest.mark.unit
def test_deploy_to_a_work_pool_needs_a_prefect_server() -> None:
    # No API URL, even where an earlier test started the session's Prefect harness.
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        result = CliRunner().invoke(app, ["deploy", "--config", QUICKSTART, "--work-pool", "team"])
    assert result.exit_code == 2
    assert "--work-pool needs PREFECT_API_URL" in result.output


@pytest.mark.integration
def test_a_worker_runs_the_deployments_registered_on_a_work_pool(
    prefect_server: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """`asyncrl deploy --work-pool` creates the pool and registers both deployments there; a
    `prefect worker start --pool` process runs a flow run with typed fields from the form."""
    url, env = prefect_server
    pool = "asyncrl-team"
    command = ["deploy", "--config", QUICKSTART, "--work-pool", pool, "--timezone", "Europe/Berlin"]
    with temporary_settings({PREFECT_API_URL: url}):  # in this process, where flows are imported
        deployed = CliRunner().invoke(app, [*command, "--working-dir", str(ROOT)])
        unknown = CliRunner().invoke(app, [*command[:3], "--work-pool", "k8", "--pool-type", "k8"])
    assert unknown.exit_code == 2
    assert "'k8' has no Prefect worker installed" in " ".join(unknown.output.split())
    assert deployed.exit_code == 0, deployed.output[-3000:]
    assert f"prefect worker start --pool {pool}" in deployed.output
    assert f"{url.removesuffix('/api')}/deployments" in deployed.output
    work_pool = _api("GET", f"{url}/work_pools/{pool}").json()
    assert work_pool["type"] == "process"

    registered = _deployments(url)
    experiment, nightly = registered["experiment"], registered["nightly-ablation"]
    assert (experiment["work_pool_name"], nightly["work_pool_name"]) == (pool, pool)
    assert experiment["entrypoint"] == "flows.deploy.experiment_from_yaml"  # no image, no upload
    assert experiment["job_variables"] == {"working_dir": str(ROOT)}
    [schedule] = [s["schedule"] for s in nightly["schedules"]]
    assert (schedule["cron"], schedule["timezone"]) == ("0 2 * * *", "Europe/Berlin")
    form = experiment["parameter_openapi_schema"]["properties"]
    assert form["algorithm"]["anyOf"][0]["enum"] == preset_names()
    assert "overrides" in form and "max_staleness" in form

    run_url = f"{url}/deployments/{experiment['id']}/create_flow_run"
    refused = httpx.post(run_url, json={"parameters": {"algorithm": "sgd"}}, timeout=10)
    assert refused.status_code == 409 and "algorithm" in refused.text  # the form's schema holds

    parameters = {
        "config_path": "experiments/quickstart.yaml",  # in the working dir, not the worker's cwd
        "algorithm": "dr_grpo",
        "max_staleness": 1,
        "total_steps": 2,
        "lr": 1e-4,
        "seed": 3,
        "fileroot": str(tmp_path / "runs"),
        "overrides": TINY,
    }
    run_id = _api("POST", run_url, json={"parameters": parameters}).json()["id"]
    worker_log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--run-once"],
        env=env,
        cwd=tmp_path,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        state = _wait_for_end(
            url, run_id, worker, (tmp_path / "worker.log").read_text, timeout_s=300
        )
    finally:
        _stop(worker)
        worker_log.close()
    assert state["type"] == "COMPLETED", (tmp_path / "worker.log").read_text()[-3000:]
    run_dir = tmp_path / "runs" / "quickstart" / "from-ui"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["algorithm"], summary["steps"], summary["max_staleness"]) == ("dr_grpo", 2, 1)
    assert summary["prefect_flow_run_id"] == run_id
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (config["algorithm"]["lr"], config["experiment"]["seed"]) == (1e-4, 3)
