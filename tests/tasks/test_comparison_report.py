"""tasks.comparison_report on a real sqlite MLflow store holding 3 algorithms × 2 seeds of logged runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from tasks.comparison_report import (
    RunRecord,
    collect_runs,
    comparison_table,
    plot_curves,
    render_markdown,
)

EXPERIMENT = "ablation-test"
# Final held-out accuracy per (algorithm, seed); the reward curve ends at accuracy - 0.1.
FINAL = {("grpo", 1): 0.50, ("grpo", 2): 0.54, ("ppo", 1): 0.40, ("ppo", 2): 0.46,
         ("dapo", 1): 0.60, ("dapo", 2): 0.60}  # fmt: skip
STEPS = 21


@dataclass
class Store:
    uri: str
    parent_id: str
    stray_id: str  # a grpo run outside the ablation (no summary, failed)


def _log_run(client: MlflowClient, experiment_id: str, algorithm: str, seed: int, final: float | None,
             parent_id: str | None, curve_end: float) -> str:  # fmt: skip
    tags = {"algorithm": algorithm, **({"mlflow.parentRunId": parent_id} if parent_id else {})}
    run = client.create_run(experiment_id, run_name=f"{algorithm}-s{seed}", tags=tags)
    run_id = run.info.run_id
    metrics = []
    for step in range(STEPS):  # reward rises linearly to curve_end - 0.1, with a seed wiggle
        frac = step / (STEPS - 1)
        wiggle = 0.0 if step == STEPS - 1 else 0.01 * seed * (step % 2)
        metrics += [Metric("reward/mean", frac * (curve_end - 0.1) + wiggle, 1000 + step, step),
                    Metric("staleness/mean", 1.0 + seed / 2, 1000 + step, step),
                    Metric("staleness/max", float(step % 4), 1000 + step, step)]  # fmt: skip
    for step in (0, 10, 20):
        metrics.append(
            Metric("eval/accuracy", 0.3 + (curve_end - 0.3) * step / 20, 2000 + step, step)
        )
    if final is not None:
        metrics += [Metric(f"final/{k}", v, 3000, 0) for k, v in
                    {"accuracy_after": final, "samples_per_s": 10.0 * seed, "mean_staleness": 0.5 * seed,
                     "max_staleness_seen": 2.0 + seed, "wall_seconds": 100.0 + seed}.items()]  # fmt: skip
    client.log_batch(run_id, metrics=metrics, params=[Param("experiment.seed", str(seed))])
    client.set_terminated(run_id, "FINISHED" if final is not None else "FAILED")
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(EXPERIMENT, artifact_location="file:///nonexistent")
    parent = client.create_run(
        experiment_id, run_name="ablation", tags={"algorithm": "grpo", "kind": "ablation"}
    )
    for (algorithm, seed), final in FINAL.items():
        _log_run(client, experiment_id, algorithm, seed, final, parent.info.run_id, final)
    client.set_terminated(parent.info.run_id)
    stray = _log_run(client, experiment_id, "grpo", 7, None, None, 0.9)
    return Store(uri, parent.info.run_id, stray)


def test_collect_runs_by_parent_and_algorithm(store: Store) -> None:
    records = collect_runs(store.uri, EXPERIMENT, parent_run_id=store.parent_id)
    assert sorted((r.algorithm, r.seed) for r in records) == sorted(FINAL)
    records = collect_runs(
        store.uri, EXPERIMENT, algorithms=["ppo", "dapo"], parent_run_id=store.parent_id
    )
    assert [(r.algorithm, r.seed) for r in records] == [
        ("ppo", 1),
        ("ppo", 2),
        ("dapo", 1),
        ("dapo", 2),
    ]
    grpo = collect_runs(store.uri, EXPERIMENT, algorithms=["grpo"])
    # Without a parent: the ablation's children plus the stray run, never the parent itself.
    assert {r.run_id for r in grpo} >= {store.stray_id}
    assert store.parent_id not in {r.run_id for r in grpo}
    assert len(grpo) == 3
    assert collect_runs(store.uri, EXPERIMENT, algorithms=["nope"]) == []
    assert collect_runs(store.uri, "no-such-experiment") == []


def test_record_fields(store: Store) -> None:
    records = collect_runs(store.uri, EXPERIMENT, algorithms=["grpo"])
    by_seed = {r.seed: r for r in records}
    run = by_seed[2]
    assert run.run_name == "grpo-s2" and run.status == "FINISHED"
    assert run.final_accuracy == pytest.approx(0.54)
    assert run.final_reward == pytest.approx(0.44)
    assert (run.samples_per_s, run.mean_staleness, run.max_staleness, run.wall_seconds) == (
        20.0,
        1.0,
        4.0,
        102.0,
    )
    assert [s for s, _ in run.accuracy_curve] == [0, 10, 20]
    assert [s for s, _ in run.reward_curve] == list(range(STEPS))
    # A failed run without a summary falls back to its histories.
    stray = by_seed[7]
    assert stray.status == "FAILED"
    assert stray.final_accuracy == pytest.approx(0.9)  # last eval/accuracy
    assert stray.mean_staleness == pytest.approx(1.0 + 7 / 2)  # latest staleness/mean
    assert stray.max_staleness == 3.0  # max over the staleness/max history
    assert stray.wall_seconds is not None and stray.wall_seconds >= 0


def test_comparison_table(store: Store) -> None:
    table = comparison_table(collect_runs(store.uri, EXPERIMENT, parent_run_id=store.parent_id))
    rows = {row["algorithm"]: row for row in table}
    assert set(rows) == {"grpo", "ppo", "dapo"}
    grpo, ppo, dapo = rows["grpo"], rows["ppo"], rows["dapo"]
    assert grpo["n_runs"] == 2 and grpo["seeds"] == [1, 2]
    assert grpo["final_accuracy"] == pytest.approx(0.52)
    assert grpo["final_accuracy_std"] == pytest.approx(math.sqrt(2 * 0.02**2))
    assert ppo["final_accuracy"] == pytest.approx(0.43)
    assert ppo["final_accuracy_std"] == pytest.approx(math.sqrt(2 * 0.03**2))
    assert dapo["final_accuracy"] == pytest.approx(0.60) and dapo[
        "final_accuracy_std"
    ] == pytest.approx(0.0)
    assert dapo["final_reward"] == pytest.approx(0.50)
    assert grpo["samples_per_s"] == pytest.approx(15.0)
    assert grpo["samples_per_s_std"] == pytest.approx(math.sqrt(50.0))
    assert grpo["mean_staleness"] == pytest.approx(0.75) and grpo["max_staleness"] == pytest.approx(
        3.5
    )
    assert grpo["wall_seconds"] == pytest.approx(101.5)


def test_table_single_seed_and_missing_values() -> None:
    records = [RunRecord("a", "a", "grpo", 1, "FINISHED", final_accuracy=0.5),
               RunRecord("b", "b", "ppo", None, "FAILED")]  # fmt: skip
    rows = comparison_table(records)
    assert rows[0]["final_accuracy"] == 0.5 and rows[0]["final_accuracy_std"] is None
    assert rows[1]["final_accuracy"] is None and rows[1]["seeds"] == []
    text = render_markdown(rows)
    assert "| grpo | 1 | 0.500 | – |" in text and "| ppo | 1 | – |" in text


def test_render_markdown(store: Store) -> None:
    table = comparison_table(collect_runs(store.uri, EXPERIMENT, parent_run_id=store.parent_id))
    text = render_markdown(table)
    lines = text.strip().splitlines()
    assert lines[0].startswith("| algorithm | runs | accuracy |") and lines[1].startswith("|---|")
    assert len(lines) == 2 + 3
    grpo = next(line for line in lines if line.startswith("| grpo "))
    assert "| 2 | 0.520 ± 0.028 |" in grpo


def test_plot_curves(store: Store, tmp_path: Path) -> None:
    records = collect_runs(store.uri, EXPERIMENT, parent_run_id=store.parent_id)
    path = plot_curves(records, tmp_path / "out" / "curves.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # two panels with three lines and bands, not an empty canvas
    empty = plot_curves([], tmp_path / "empty.png")
    assert empty.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
