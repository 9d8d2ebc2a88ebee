"""Comparing the runs of an MLflow experiment: the GRPO/PPO/DAPO ablation report.

:func:`collect_runs` reads runs (optionally only one algorithm set, or only the children of one
parent run, e.g. an ablation), :func:`comparison_table` aggregates them per algorithm over seeds,
:func:`plot_curves` draws held-out accuracy and mean reward against the step, and
:func:`render_markdown` formats the table for Prefect artifacts and the terminal.

Numbers come from what :mod:`tasks.mlflow_tracking` logs: ``final/<summary key>`` metrics
(``final/accuracy_after``, ``final/samples_per_s``, ``final/mean_staleness``,
``final/max_staleness_seen``, ``final/wall_seconds``) and the train loop's metric histories
(``eval/accuracy``, ``reward/mean``, ``staleness/*``, ``throughput/samples_per_s``), which stand
in when a run has no summary (it failed or is still running).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)

ACCURACY_CURVE = "eval/accuracy"
REWARD_CURVE = "reward/mean"
# (RunRecord attribute = table column, markdown header, number format)
COLUMNS: list[tuple[str, str, str]] = [
    ("final_accuracy", "accuracy", ".3f"),
    ("final_reward", "reward", ".3f"),
    ("samples_per_s", "samples/s", ".1f"),
    ("mean_staleness", "staleness mean", ".2f"),
    ("max_staleness", "staleness max", ".0f"),
    ("wall_seconds", "wall s", ".0f"),
]

Curve = list[tuple[int, float]]


@dataclass
class RunRecord:
    """One run's numbers; None where the run did not log them."""

    run_id: str
    run_name: str
    algorithm: str
    seed: int | None
    status: str
    final_accuracy: float | None = None
    final_reward: float | None = None
    samples_per_s: float | None = None
    mean_staleness: float | None = None
    max_staleness: float | None = None
    wall_seconds: float | None = None
    accuracy_curve: Curve = field(default_factory=list)
    reward_curve: Curve = field(default_factory=list)


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _search(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string,
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000,
                                  order_by=["attributes.start_time ASC"], page_token=token)  # fmt: skip
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _history(client: MlflowClient, run_id: str, key: str) -> Curve:
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    # A resumed run may log a step twice: keep the last value per step.
    return sorted({m.step: m.value for m in points}.items())


def _record(client: MlflowClient, run: Run) -> RunRecord:
    metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
    seed_text = params.get("experiment.seed") or tags.get("seed")
    accuracy = _history(client, run.info.run_id, ACCURACY_CURVE)
    reward = _history(client, run.info.run_id, REWARD_CURVE)

    def final(key: str, fallback: float | None = None) -> float | None:
        value = metrics.get(f"final/{key}")
        return value if value is not None else fallback

    max_staleness = final("max_staleness_seen")
    if max_staleness is None and "staleness/max" in metrics:  # only the latest is in run.data
        max_staleness = max(v for _, v in _history(client, run.info.run_id, "staleness/max"))
    wall = None
    if run.info.end_time and run.info.start_time:
        wall = (run.info.end_time - run.info.start_time) / 1000
    return RunRecord(
        run_id=run.info.run_id,
        run_name=run.info.run_name or run.info.run_id,
        algorithm=tags.get("algorithm") or params.get("algorithm.name") or "unknown",
        seed=int(seed_text) if seed_text and seed_text.lstrip("-").isdigit() else None,
        status=run.info.status,
        final_accuracy=final("accuracy_after", accuracy[-1][1] if accuracy else None),
        final_reward=reward[-1][1] if reward else None,
        samples_per_s=final("samples_per_s", metrics.get("throughput/samples_per_s")),
        mean_staleness=final("mean_staleness", metrics.get("staleness/mean")),
        max_staleness=max_staleness,
        wall_seconds=final("wall_seconds", wall),
        accuracy_curve=accuracy,
        reward_curve=reward,
    )


def collect_runs(
    tracking_uri: str,
    experiment_name: str,
    *,
    algorithms: list[str] | None = None,
    parent_run_id: str | None = None,
) -> list[RunRecord]:
    """The experiment's active runs, in ``algorithms`` order then start time.

    ``algorithms`` keeps runs whose ``algorithm`` tag is one of them (one search per value:
    MLflow rejects ``IN`` on tags); ``parent_run_id`` keeps the children of that run (an
    ablation or sweep). Without ``parent_run_id`` parent runs themselves are skipped, since they
    carry the algorithm tag of their base config but no training metrics. An unknown experiment
    gives ``[]``.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        logger.warning("no MLflow experiment %r at %s", experiment_name, tracking_uri)
        return []
    base = f"tags.`mlflow.parentRunId` = {_quote(parent_run_id)}" if parent_run_id else ""
    filters = [base] if algorithms is None else [
        " and ".join(f for f in (base, f"tags.algorithm = {_quote(a)}") if f) for a in algorithms
    ]  # fmt: skip
    runs: list[Run] = []
    seen: set[str] = set()
    for filter_string in filters:
        for run in _search(client, experiment.experiment_id, filter_string):
            if run.info.run_id not in seen:
                seen.add(run.info.run_id)
                runs.append(run)
    if parent_run_id is None:
        children = _search(client, experiment.experiment_id, "tags.`mlflow.parentRunId` LIKE '%'")
        parents = {run.data.tags["mlflow.parentRunId"] for run in children}
        runs = [run for run in runs if run.info.run_id not in parents]
    return [_record(client, run) for run in runs]


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def comparison_table(records: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """One row per algorithm (first-seen order): ``n_runs``, ``seeds`` and, per column,
    ``<col>`` (mean over the runs that logged it) and ``<col>_std`` (sample std; None for one)."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.algorithm, []).append(record)
    table = []
    for algorithm, group in groups.items():
        row: dict[str, Any] = {"algorithm": algorithm, "n_runs": len(group),
                               "seeds": sorted(r.seed for r in group if r.seed is not None)}  # fmt: skip
        for column, _, _ in COLUMNS:
            values = [
                v for r in group if (v := getattr(r, column)) is not None and math.isfinite(v)
            ]
            row[column], row[f"{column}_std"] = _mean_std(values)
        table.append(row)
    return table


def render_markdown(table: Sequence[dict[str, Any]]) -> str:
    """A GitHub-flavoured markdown table: ``mean ± std`` over seeds, ``–`` where missing."""
    headers = ["algorithm", "runs", *[header for _, header, _ in COLUMNS]]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|",
    ]
    for row in table:
        cells = [str(row["algorithm"]), str(row["n_runs"])]
        for column, _, fmt in COLUMNS:
            mean, std = row.get(column), row.get(f"{column}_std")
            if mean is None:
                cells.append("–")
            elif std is None:
                cells.append(format(mean, fmt))
            else:
                cells.append(f"{format(mean, fmt)} ± {format(std, fmt)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mean_curve(curves: Sequence[Curve]) -> tuple[list[int], list[float], list[float]]:
    """Per step: mean and std over the runs that logged that step (runs may stop early)."""
    by_step: dict[int, list[float]] = {}
    for curve in curves:
        for step, value in curve:
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    means = [statistics.fmean(by_step[s]) for s in steps]
    stds = [statistics.stdev(by_step[s]) if len(by_step[s]) > 1 else 0.0 for s in steps]
    return steps, means, stds


def plot_curves(records: Sequence[RunRecord], path: str | Path) -> Path:
    """PNG with held-out accuracy and mean reward vs step, one line per algorithm (mean over
    seeds, ±1 std band when there are several)."""
    # The object-oriented API with the Agg canvas: no pyplot, so no global backend switch and
    # no figure registry leaking memory in a long-lived worker.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    panels = [
        ("accuracy_curve", "held-out accuracy", ACCURACY_CURVE),
        ("reward_curve", "mean reward", REWARD_CURVE),
    ]
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.algorithm, []).append(record)
    for ax, (attribute, title, metric) in zip(fig.subplots(1, 2), panels, strict=True):
        for index, (algorithm, group) in enumerate(groups.items()):
            curves = [c for r in group if (c := getattr(r, attribute))]
            if not curves:
                continue
            steps, means, stds = _mean_curve(curves)
            color = f"C{index % 10}"
            ax.plot(
                steps,
                means,
                color=color,
                marker="o" if len(steps) < 20 else None,
                markersize=3,
                label=f"{algorithm} (n={len(curves)})",
            )
            if len(curves) > 1:
                lower = [m - s for m, s in zip(means, stds, strict=True)]
                upper = [m + s for m, s in zip(means, stds, strict=True)]
                ax.fill_between(steps, lower, upper, color=color, alpha=0.2, linewidth=0)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.savefig(path, format="png")
    logger.info("wrote %s", path)
    return path
