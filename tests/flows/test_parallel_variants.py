"""Ablation variants and sweep trials side by side (flows/parallel.py): how many at once, bad
values refused before work, an eval hook answered across the pipe, a real 2-variant ablation in
two processes, and a failing variant stopping the other."""

from __future__ import annotations

import json
import time
from pathlib import Path
from uuid import UUID

import mlflow
import optuna
import pytest
from typer.testing import CliRunner

from core.config import ConfigError, load_config, parse_config
from flows.cli import app
from flows.parallel import (
    VariantJob,
    _end_stopped_runs,
    available_cores,
    parse_parallel,
    resolve_parallelism,
    run_all,
    variant_cpus,
)
from tasks.comparison_report import collect_runs, comparison_table
from tasks.mlflow_tracking import ensure_experiment, tracking_uri
from tests.flows.test_flows import QUICKSTART, TINY, client_for
from tests.processes import live_descendants


def _config(*overrides: str):
    return load_config(QUICKSTART, list(overrides))


# ------------------------------------------------------------------------------ how many


@pytest.mark.unit
def test_auto_divides_the_cores_by_what_one_run_keeps_busy() -> None:
    default = _config()
    assert variant_cpus(default) == 2  # the learner rank and the rollout worker, 1 thread each
    assert resolve_parallelism(None, [default] * 3, cores=2)[0] == 1  # this box: sequential
    assert resolve_parallelism(None, [default] * 3, cores=5)[0] == 2
    assert resolve_parallelism(None, [default] * 3, cores=64)[0] == 3  # no more than the runs
    # The real machine: a 2-core box runs one at a time.
    assert resolve_parallelism(None, [default] * 3)[0] == max(1, min(3, available_cores() // 2))

    wide = _config("learner.n_ranks=2", "scheduler.torch_threads=2", "rollout.reward_workers=2")
    assert variant_cpus(wide) == (2 + 1) * 2 + 2
    assert resolve_parallelism(None, [default, wide], cores=16)[0] == 2  # the widest decides
    assert resolve_parallelism(None, [default, wide], cores=15)[0] == 1

    ray = _config("scheduler.type=ray", "scheduler.learner_cpus=4", "scheduler.rollout_cpus=2")
    assert variant_cpus(ray) == 6  # what it reserves from Ray, more than its threads
    gpu = _config("cluster.n_gpus_per_node=4")
    assert resolve_parallelism(None, [gpu] * 4, cores=64)[0] == 2  # 2 GPUs a run: 4 // 2

    n, why = resolve_parallelism(None, [default] * 3, cores=2)
    assert "2 core(s)" in why and "2 per run" in why and "one after another" in why
    assert resolve_parallelism(5, [default] * 3, cores=2) == (
        3,
        "parallel=5 (asked), capped at the 3 to run",
    )
    assert resolve_parallelism(2, [default] * 3, cores=1)[0] == 2  # a number forces it


@pytest.mark.unit
def test_parallel_values() -> None:
    assert parse_parallel("auto") is None and parse_parallel(" AUTO ") is None
    assert parse_parallel(2) == 2 and parse_parallel("3") == 3
    for bad in (0, "0", "x", "-1", "1.5", "", True):
        with pytest.raises(ValueError, match="parallel must be 'auto' or a whole number"):
            parse_parallel(bad)


@pytest.mark.unit
@pytest.mark.parametrize(
    "command",
    [
        ["ablate", QUICKSTART, "--parallel", "0"],
        ["ablate", QUICKSTART, "--parallel", "x"],
        ["sweep", QUICKSTART, "--space", "experiments/sweeps/staleness.yaml", "--parallel", "x"],
    ],
)
def test_a_bad_parallel_exits_2_before_any_work(command: list[str], tmp_path: Path) -> None:
    out = CliRunner().invoke(app, [*command, f"cluster.fileroot={tmp_path}"])
    assert out.exit_code == 2, out.output
    assert "--parallel" in out.output and command[-1] in out.output
    assert not any(tmp_path.iterdir())


@pytest.mark.unit
def test_the_flows_refuse_a_bad_parallel_before_any_work(tmp_path: Path) -> None:
    from flows.ablation import ablation
    from flows.sweep import SearchSpace, sweep

    source = parse_config(QUICKSTART, [f"cluster.fileroot={tmp_path}"])
    with pytest.raises(ValueError, match="parallel must be"):
        ablation.fn(source, ["grpo"], 1, parallel="x")
    space = SearchSpace(params={"rollout.max_staleness": {"type": "categorical", "choices": [0]}})
    with pytest.raises(ValueError, match="parallel must be"):
        sweep.fn(source, space, n_trials=1, parallel=0)
    assert not any(tmp_path.iterdir())


@pytest.mark.unit
def test_a_childs_eval_is_answered_by_the_parents_hook_and_its_error_raised_there() -> None:
    """The two ends of the pipe: the child's on_eval asks, the parent's hook (Optuna's pruning)
    answers; what the hook raises is raised in the child, where it stops the run."""
    import multiprocessing as mp
    import threading

    from flows.parallel import _answer_eval, _RemoteEval

    seen: list[tuple[int, float]] = []

    def prune_after_first(version: int, accuracy: float) -> None:
        seen.append((version, accuracy))
        if len(seen) > 1:
            raise optuna.TrialPruned(f"accuracy {accuracy} at version {version}")

    job = VariantJob("t", _config(), "parent", "t", "t", on_eval=prune_after_first)
    parent_end, child_end = mp.Pipe()

    def parent() -> None:
        for _ in range(2):
            kind, version, accuracy = parent_end.recv()
            assert kind == "eval"
            parent_end.send(_answer_eval(job, version, accuracy))

    answering = threading.Thread(target=parent)
    answering.start()
    on_eval = _RemoteEval(child_end)
    on_eval(0, 0.25)  # answered "continue"
    with pytest.raises(optuna.TrialPruned, match="accuracy 0.5 at version 2"):
        on_eval(2, 0.5)
    answering.join(10)
    assert seen == [(0, 0.25), (2, 0.5)]


# ------------------------------------------------------------------------------ real runs


def _child_runs(client: mlflow.MlflowClient, parent: mlflow.entities.Run) -> list:
    return client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )


@pytest.mark.integration
@pytest.mark.usefixtures("harness")
def test_two_variants_run_at_once_under_one_parent(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client

    from flows.ablation import ablation

    before = {p.pid for p in live_descendants()}
    source = parse_config(
        QUICKSTART,
        [
            *TINY,
            f"cluster.fileroot={tmp_path}",
            "eval.every_n_steps=0",
            "learner.total_steps=1",
            "experiment.trial=par",
        ],  # fmt: skip
    )
    started = time.perf_counter()
    result = ablation(source, ["grpo", "ppo"], 1, parallel=2)
    print(f"2-variant ablation, parallel=2: {time.perf_counter() - started:.1f} s")

    # Results in (algorithm, seed) order, whatever finished first; summary.json says the same.
    assert [(r["algorithm"], r["seed"]) for r in result["runs"]] == [("grpo", 1), ("ppo", 1)]
    on_disk = json.loads((tmp_path / "quickstart" / "ablation-par" / "summary.json").read_text())
    assert on_disk["runs"] == result["runs"] and on_disk["table"] == result["table"]
    uri = tracking_uri(load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}"]))
    parent_id = result["mlflow_parent_run_id"]
    records = collect_runs(uri, "quickstart", algorithms=["grpo", "ppo"], parent_run_id=parent_id)
    assert result["table"] == comparison_table(records)  # what the sequential path computes
    assert [row["algorithm"] for row in result["table"]] == ["grpo", "ppo"]

    client = client_for(tmp_path)
    parent = client.get_run(parent_id)
    assert parent.data.tags["parallel"] == "2" and parent.info.status == "FINISHED"
    children = {r.info.run_id: r for r in _child_runs(client, parent)}
    assert set(children) == {r["mlflow_run_id"] for r in result["runs"]}
    assert {r.info.status for r in children.values()} == {"FINISHED"}
    # Really concurrent: each run started before the other ended.
    first, second = sorted(children.values(), key=lambda r: r.info.start_time)
    assert second.info.start_time < first.info.end_time, "the variants ran one after another"

    # In Prefect, each variant's flow run is a subflow of the ablation's flow run.
    ablation_flow_run = UUID(parent.data.tags["prefect_flow_run_id"])
    with get_client(sync_client=True) as prefect:
        for run in children.values():
            flow_run = prefect.read_flow_run(UUID(run.data.tags["prefect_flow_run_id"]))
            assert flow_run.state.is_completed()
            assert flow_run.parent_task_run_id is not None
            tracking_task = prefect.read_task_run(flow_run.parent_task_run_id)
            assert tracking_task.flow_run_id == ablation_flow_run
    left = [p for p in live_descendants() if p.pid not in before and _is_ours(p)]
    assert not left, [p.cmdline() for p in left]


@pytest.mark.integration
@pytest.mark.usefixtures("harness")
def test_a_failing_variant_stops_the_others(tmp_path: Path) -> None:
    """B's data has no 'question' column (a ConfigError in its data stage); A, meant to run
    for hours, is stopped: run_all raises B's error, of its own type, and leaves nothing
    running."""
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "1+1", "answer": "2"}) + "\n")
    root = f"cluster.fileroot={tmp_path}"
    long = _config(*TINY, root, "experiment.trial=long", "sft.steps=100000")
    bad = _config(*TINY, root, "experiment.trial=bad", "data.source=dataset", f"data.path={data}")
    client = client_for(tmp_path)
    experiment_id = ensure_experiment(long)  # with its artifacts under the fileroot
    parent = client.create_run(experiment_id, run_name="parent").info.run_id
    jobs = [VariantJob(c.experiment.trial, c, parent, c.experiment.trial, c.experiment.trial)
            for c in (long, bad)]  # fmt: skip
    before = {p.pid for p in live_descendants()}

    with pytest.raises(ConfigError, match="question") as caught:
        run_all(jobs, 2)
    assert any("in variant bad" in note for note in caught.value.__notes__)
    assert not (tmp_path / "quickstart" / "long" / "summary.json").exists()
    assert not (tmp_path / "quickstart" / "long" / "LOCK").exists()  # it unwound
    left = [p for p in live_descendants() if p.pid not in before and _is_ours(p)]
    assert not left, [p.cmdline() for p in left]
    statuses = {r.info.run_name: r.info.status for r in client.search_runs([experiment_id])}
    assert statuses["bad"] == "FAILED"
    assert statuses.get("long", "never started") != "RUNNING"


def test_a_stopped_variants_run_left_running_is_ended_as_killed(tmp_path: Path) -> None:
    """A variant can die before it ends its own run (killed after the grace period, or its
    sqlite store locked mid-write, as CI saw once): run_all ends it for it, and only it."""
    config = _config(*TINY, f"cluster.fileroot={tmp_path}", "experiment.trial=long")
    client = client_for(tmp_path)
    experiment_id = ensure_experiment(config)
    parent = client.create_run(experiment_id, run_name="parent").info.run_id
    other_parent = client.create_run(experiment_id, run_name="other").info.run_id

    def child(parent_id: str) -> str:
        tags = {"mlflow.parentRunId": parent_id, "mlflow.runName": "long"}
        return client.create_run(experiment_id, run_name="long", tags=tags).info.run_id

    stopped, unrelated = child(parent), child(other_parent)
    _end_stopped_runs([VariantJob("long", config, parent, "long", "long")])
    assert client.get_run(stopped).info.status == "KILLED"
    assert client.get_run(unrelated).info.status == "RUNNING"  # another parent's variant


def _is_ours(process) -> bool:
    """A variant or one of its workers (spawned); not multiprocessing's resource tracker."""
    try:
        command = " ".join(process.cmdline())
    except Exception:
        return False
    return "multiprocessing" in command and "resource_tracker" not in command
