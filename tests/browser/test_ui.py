"""The operator's path through the UIs, in headless Chromium, as docs/tutorials/orchestration.md
tells it: ``asyncrl stack up``, ``asyncrl deploy``, then the Prefect UI (the ``experiment``
deployment's run form, edited and submitted; the flow run watched to the end) and the MLflow UI
(a GRPO/PPO/DAPO ablation compared on its eval-accuracy chart). Screenshots go to
``test-artifacts/browser/`` (or ``$ASYNCRL_TEST_ARTIFACTS/browser``).

Without a system Chromium these tests skip and say what to install, except where
``ASYNCRL_BROWSER_TESTS=required`` (CI sets it, after installing the browser): there they fail.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from core.training.distributed import free_ports
from infra.stack import StackInfo, stack_down, stack_up
from tests.browser.browser import (
    REQUIRED_ENV,
    by_text,
    click_text,
    page_text,
    screenshot_dir,
    start_chromium,
    system_browser,
    wait_for,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
QUICKSTART = "experiments/quickstart.yaml"
# The deployments' defaults: a quickstart small enough for a test (~30 s a run on 2 cores).
SMALL = ["data.n_train=120", "data.n_test=16", "eval.n_problems=16", "eval.max_new_tokens=8",
         "sft.steps=2", "rollout.batch_size=4", "algorithm.group_size=2",
         "sampling.max_new_tokens=16", "eval.every_n_steps=1", "learner.total_steps=1"]  # fmt: skip
FINAL_STATES = ("Completed", "Failed", "Crashed", "Cancelled")


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    found = system_browser()
    if found is None:
        reason = ("no system Chromium: install Debian's `chromium` and `chromium-driver` "
                  "(apt-get install chromium chromium-driver) to run the browser tests")  # fmt: skip
        if os.environ.get(REQUIRED_ENV) == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    driver = start_chromium(*found)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    state_dir = tmp_path_factory.mktemp("ui-stack")
    prefect, mlflow_port, s3 = free_ports(3)
    info = stack_up(state_dir, prefect_port=prefect, mlflow_port=mlflow_port, s3_port=s3)
    try:
        yield info
    finally:
        stack_down(state_dir)


def _api(stack: StackInfo, method: str, path: str, **kwargs: Any) -> Any:
    url = f"{stack.env()['PREFECT_API_URL']}{path}"
    for attempt in range(8):  # 503: the server's sqlite was busy; Prefect's client retries too
        reply = httpx.request(method, url, timeout=10, **kwargs)
        if reply.status_code != 503:
            break
        time.sleep(0.5 * 2**attempt)
    reply.raise_for_status()
    return reply.json()


@pytest.fixture(scope="module")
def served(stack: StackInfo) -> Iterator[subprocess.Popen]:
    """``asyncrl deploy`` in the stack's environment, as the docs' operator runs it."""
    env = {**os.environ, **stack.env(), "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    log = Path(stack.state_dir) / "logs" / "deploy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(BIN / "asyncrl"), "deploy", "--config", QUICKSTART, "--timezone",
                                 "Europe/Berlin", *SMALL],
                                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_api(stack, "POST", "/deployments/filter", json={})) < 2:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "deployments not registered in 120 s"
            time.sleep(1)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _mlflow_runs(stack: StackInfo, where: str = "") -> list[dict[str, Any]]:
    """The quickstart experiment's runs, from the MLflow server's REST API."""
    api = f"{stack.urls()['MLflow UI']}/api/2.0/mlflow"
    experiment = httpx.get(f"{api}/experiments/get-by-name",
                           params={"experiment_name": "quickstart"}).json()["experiment"]  # fmt: skip
    body = {"experiment_ids": [experiment["experiment_id"]], "filter": where}
    return httpx.post(f"{api}/runs/search", json=body).json().get("runs", [])


def _shot(chrome: Any, name: str) -> Path:
    path = screenshot_dir() / name
    chrome.save_screenshot(str(path))
    return path


def _watch_flow_run(chrome: Any, served: subprocess.Popen, timeout_s: float) -> str:
    """Stay on the flow run's page, refreshing, until its state badge (the first on the page,
    in the header) shows a final state; return that state."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert served.poll() is None, "the deployments' process died"
        badge = wait_for("the flow run's state badge",
                         lambda: chrome.find_elements(By.XPATH, "//*[contains(concat(' ', @class, ' '), ' state-badge ')]"))  # fmt: skip
        state = badge[0].text.strip()  # type: ignore[index]
        if state in FINAL_STATES:
            return state
        assert time.monotonic() < deadline, f"flow run still {state!r} after {timeout_s:.0f} s"
        time.sleep(3)
        chrome.refresh()


def _open_deployment_run(chrome: Any, stack: StackInfo, deployment: str, how: str) -> None:
    """From the Deployments page: the deployment, then Run → ``how`` (Quick run/Custom run)."""
    chrome.get(f"{stack.urls()['Prefect UI']}/deployments")
    click_text(chrome, deployment)
    click_text(chrome, "Run", "button")
    click_text(chrome, how)


def _deployment_runs(stack: StackInfo, deployment: str) -> dict[str, dict[str, Any]]:
    """The deployment's flow runs by id, from the Prefect API."""
    [found] = [d for d in _api(stack, "POST", "/deployments/filter", json={})
               if d["name"] == deployment]  # fmt: skip
    body = {"deployments": {"id": {"any_": [found["id"]]}}}
    return {r["id"]: r for r in _api(stack, "POST", "/flow_runs/filter", json=body)}


def _follow_new_run(
    chrome: Any, stack: StackInfo, deployment: str, before: set[str], resubmit: bool = False
) -> str:
    """Open the flow run the UI just created for ``deployment`` (one not in ``before``, due now:
    not the nightly schedule's next run) and return its id. The UI toasts a "View run" link, but
    a toast can come and go between two polls on a busy box, so the run is found through the API.
    With ``resubmit``, a form still showing after 45 s with no new run (the UI's create request
    failed; it shows an error and stays) is submitted once more."""

    def created() -> str | None:
        soon = time.time() + 60
        for run_id, run in _deployment_runs(stack, deployment).items():
            start = run.get("expected_start_time") or run["created"]
            if run_id not in before and _epoch(start) < soon:
                return run_id
        return None

    try:
        run_id = wait_for("the new flow run", created, timeout_s=45, interval_s=1)
    except AssertionError as err:
        if not (resubmit and by_text(chrome, "Submit", "button")):
            page = page_text(chrome)[:800]
            raise AssertionError(f"no new run of {deployment}; the page: {page}") from err
        _shot(chrome, "submit-retried.png")
        click_text(chrome, "Submit", "button")
        run_id = wait_for("the new flow run (form submitted again)", created, timeout_s=60,
                          interval_s=1)  # fmt: skip
    chrome.get(f"{stack.urls()['Prefect UI']}/runs/flow-run/{run_id}")
    return str(run_id)


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def test_prefect_ui_runs_the_experiment_from_its_form(
    chrome: Any, stack: StackInfo, served: subprocess.Popen
) -> None:
    chrome.get(f"{stack.urls()['Prefect UI']}/deployments")
    wait_for("both deployments Ready", lambda: len(by_text(chrome, "Ready")) >= 2)
    deployed = {d["name"]: d for d in _api(stack, "POST", "/deployments/filter", json={})}
    [schedule] = [s["schedule"] for s in deployed["nightly-ablation"]["schedules"]]
    assert (schedule["cron"], schedule["timezone"]) == ("0 2 * * *", "Europe/Berlin")
    assert "nightly-ablation" in page_text(chrome) and "experiment" in page_text(chrome)
    _shot(chrome, "01-prefect-deployments.png")

    before = set(_deployment_runs(stack, "experiment"))
    _open_deployment_run(chrome, stack, "experiment", "Custom run")
    # The user sets η = 1 in its typed field and adds an override for the trial's name.
    staleness = ("//span[contains(@class, 'schema-form-property__label') and "
                 "starts-with(normalize-space(.), 'Max staleness')]"
                 "/ancestor::div[contains(concat(' ', @class, ' '), ' schema-form-property ')][1]")  # fmt: skip
    switch = wait_for("the Max staleness field's int switch",
                      lambda: chrome.find_elements(By.XPATH, f"{staleness}//button[normalize-space(.)='int']"))  # fmt: skip
    switch[0].click()  # type: ignore[index]
    number = wait_for("its number input",
                      lambda: chrome.find_elements(By.XPATH, f"{staleness}//input[@type='number']"))  # fmt: skip
    number[0].send_keys("1")  # type: ignore[index]
    click_text(chrome, "Add item", "button")
    empty = wait_for("an empty list item",
                     lambda: [t for t in chrome.find_elements(By.TAG_NAME, "textarea")
                              if t.is_displayed() and not t.get_attribute("value")])  # fmt: skip
    empty[-1].send_keys("experiment.trial=from-browser")  # type: ignore[index]
    chrome.execute_script("arguments[0].scrollIntoView()", chrome.find_element(By.XPATH, staleness))
    _shot(chrome, "02-prefect-run-form.png")
    click_text(chrome, "Submit", "button")
    run_id = _follow_new_run(chrome, stack, "experiment", before, resubmit=True)

    assert _watch_flow_run(chrome, served, timeout_s=420) == "Completed"
    # The project's progress lines are in the run's Logs tab, beside Prefect's own.
    wait_for("a progress line in the Logs tab",
             lambda: re.search(r"sft_warm_start \d+/\d+ \(", page_text(chrome)))  # fmt: skip
    _shot(chrome, "03-prefect-flow-run-completed.png")

    run = _api(stack, "GET", f"/flow_runs/{run_id}")
    assert run["state"]["type"] == "COMPLETED"
    assert run["parameters"]["max_staleness"] == 1
    assert run["parameters"]["overrides"][-1] == "experiment.trial=from-browser"
    # The MLflow run it made: linked to this flow run, with the edited η.
    [tracked] = _mlflow_runs(stack, "attributes.run_name = 'grpo-from-browser'")
    tags = {t["key"]: t["value"] for t in tracked["data"]["tags"]}
    params = {p["key"]: p["value"] for p in tracked["data"]["params"]}
    assert tags["prefect_flow_run_id"] == run_id and params["rollout.max_staleness"] == "1"

    click_text(chrome, "Artifacts")
    wait_for("the summary artifact", lambda: "experiment-summary" in page_text(chrome))
    _shot(chrome, "04-prefect-summary-artifact.png")


def test_mlflow_ui_compares_an_ablation(
    chrome: Any, stack: StackInfo, served: subprocess.Popen
) -> None:
    # The nightly ablation, started now from its deployment page: GRPO, PPO and DAPO.
    before = set(_deployment_runs(stack, "nightly-ablation"))
    _open_deployment_run(chrome, stack, "nightly-ablation", "Quick run")
    _follow_new_run(chrome, stack, "nightly-ablation", before)
    assert _watch_flow_run(chrome, served, timeout_s=600) == "Completed"

    chrome.get(stack.urls()["MLflow UI"])
    click_text(chrome, "Model training")
    click_text(chrome, "quickstart", "a")
    wait_for("the runs table", lambda: "matching runs" in page_text(chrome))
    for close in chrome.find_elements(By.XPATH, "//button[@aria-label='Close']"):
        if close.is_displayed():  # the assistant's side panel
            close.click()
    # Expand the ablation's parent run to show its three children.
    expand = wait_for("the parent run's expander",
                      lambda: chrome.find_elements(By.XPATH, "//button[contains(@data-component-id, 'runnamecellrenderer')]"))  # fmt: skip
    expand[0].click()  # type: ignore[index]
    for child in ("grpo-s1", "ppo-s1", "dapo-s1"):
        wait_for(f"child run {child}", lambda child=child: by_text(chrome, child))
    _shot(chrome, "05-mlflow-ablation-runs.png")

    # The chart view, filtered to held-out accuracy: one line per algorithm.
    chart_icon = chrome.find_element(
        By.XPATH, "//*[name()='path' and starts-with(@d, 'm15.03 5.03')]"
    )
    chart_icon.find_element(By.XPATH, "./ancestor::span[@role='img']").click()
    search = wait_for("the chart search box",
                      lambda: chrome.find_elements(By.XPATH, "//input[@placeholder='Search metric charts']"))  # fmt: skip
    search[0].send_keys("eval/accuracy", Keys.ENTER)  # type: ignore[index]
    legend = wait_for("the eval/accuracy chart's legend",
                      lambda: all(f"{c} (eval/accuracy)" in page_text(chrome)
                                  for c in ("grpo-s1", "ppo-s1", "dapo-s1")))  # fmt: skip
    assert legend
    _shot(chrome, "06-mlflow-eval-accuracy-chart.png")
    assert "compareRunsMode=CHART" in chrome.current_url
    # Each child's MLflow record, as the chart draws it: eval/accuracy in [0, 1].
    by_name = {r["info"]["run_name"]: r for r in _mlflow_runs(stack)}
    for child in ("grpo-s1", "ppo-s1", "dapo-s1"):
        metrics = {m["key"]: m["value"] for m in by_name[child]["data"]["metrics"]}
        assert 0.0 <= metrics["eval/accuracy"] <= 1.0
    tags = {t["key"]: t["value"] for t in by_name["grpo-s1"]["data"]["tags"]}
    assert tags["mlflow.source.name"] == "asyncrl quickstart" and tags["algorithm"] == "grpo"
