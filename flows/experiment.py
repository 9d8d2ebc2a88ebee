"""One experiment as one Prefect flow run: data → warm start → async RL → eval → report.

Parameters are what a user edits in the Prefect UI: a config path and dotted overrides. The
flow records everything in one MLflow run (params, tags, per-step metrics, artifacts) and
publishes the summary table as a Prefect markdown artifact.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from core.config import ConfigError, load_config, to_yaml
from core.runtime.metrics import FanOut, JsonlSink, MemorySink
from core.storage import join, local_path, write_text
from tasks.stages import (
    build_model_task,
    evaluate_task,
    prepare_data_task,
    report_task,
    rl_task,
    sft_task,
)
from tasks.tracking import MLflowSink, log_summary, start_run, tracking_uri


def summary_markdown(summary: dict[str, Any], run_id: str) -> str:
    """The summary table shown in Prefect (and close to what the CLI prints)."""

    def fmt(value: Any) -> str:
        return "—" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [
        ("algorithm", summary["algorithm"]),
        ("staleness bound η", summary["max_staleness"]),
        ("held-out problems", summary["data"]["n_test"]),
        ("accuracy before RL", summary.get("accuracy_before")),
        ("accuracy after RL", summary.get("accuracy_after")),
        ("RL steps", summary.get("steps")),
        ("samples/s", summary.get("samples_per_s")),
        ("learner busy fraction", summary.get("learner_busy_fraction")),
        (
            "mean / max staleness",
            f"{fmt(summary.get('mean_staleness'))} / {fmt(summary.get('max_staleness_seen'))}",
        ),
        ("wall seconds", summary.get("wall_seconds")),
        ("MLflow run", run_id),
        ("checkpoints", summary.get("checkpoint_url")),
        ("run folder", summary["run_dir"]),
    ]
    lines = [f"# {summary['experiment']} / {summary['trial']}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {fmt(value)} |" for name, value in rows]
    return "\n".join(lines) + "\n"


@flow(name="experiment")
def experiment(
    config_path: str = "experiments/quickstart.yaml",
    overrides: list[str] | None = None,
    parent_run_id: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Run one experiment; returns the MLflow run id, the checkpoint URL and the summary."""
    try:
        config = load_config(config_path, list(overrides or []))
    except ConfigError as err:  # before any work: the UI shows this message
        raise ValueError(f"invalid config: {err}") from None
    if not config.experiment.trial:
        config.experiment.trial = time.strftime("%Y%m%d-%H%M%S")
    started = time.perf_counter()
    timings: dict[str, float] = {}
    write_text(join(config.run_dir, "config.yaml"), to_yaml(config))
    with start_run(
        config,
        run_name=run_name or f"{config.algorithm.name}-{config.experiment.trial}",
        parent_run_id=parent_run_id,
    ) as run:
        run_id = run.info.run_id
        memory = MemorySink()
        sink = FanOut(
            [
                memory,
                MLflowSink(run_id),
                JsonlSink(local_path(join(config.run_dir, "metrics.jsonl"))),
            ]
        )

        t = time.perf_counter()
        data = prepare_data_task(config)
        model_dir = build_model_task(config, data)
        timings["prepare_s"] = time.perf_counter() - t
        if config.sft.enabled and config.sft.steps > 0:
            t = time.perf_counter()
            model_dir = sft_task(config, model_dir, data, sink)
            timings["sft_s"] = time.perf_counter() - t
        rl = evaluation = None
        t = time.perf_counter()
        if config.actor.total_steps > 0:
            rl = rl_task(config, model_dir, data, sink)
        else:
            evaluation = evaluate_task(config, model_dir, data)
        timings["rl_s" if rl else "eval_s"] = time.perf_counter() - t
        sft_loss = memory.series("sft/loss")
        ids = {
            "mlflow_run_id": run_id,
            "mlflow_tracking_uri": tracking_uri(config),
            "prefect_flow_run_id": str(flow_run.id or ""),
        }
        summary = report_task(
            config,
            data,
            model_dir,
            rl,
            evaluation,
            timings,
            started,
            sft_loss[-1][1] if sft_loss else None,
            ids,
        )
        log_summary(run_id, summary)
        create_markdown_artifact(
            markdown=summary_markdown(summary, run_id),
            key="experiment-summary",
            description=f"{config.experiment.name}/{config.experiment.trial}",
        )
    return {
        "mlflow_run_id": run_id,
        "checkpoint_url": summary.get("checkpoint_url"),
        "summary": summary,
    }
