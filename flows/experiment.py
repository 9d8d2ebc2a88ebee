"""One experiment as one Prefect flow run, recorded in one MLflow run.

The flow runs the pipeline of :mod:`core.runtime.job` (data → model → SFT warm start → RL → eval
→ report), each stage as a Prefect task, with an MLflow metric sink beside the run's own files,
and publishes the summary table as a Prefect markdown artifact. The timeline plots and the
TensorBoard files (``tracking.tensorboard``) become artifacts of the MLflow run.

``experiment`` takes a parsed :class:`~core.config.Config`: the CLI calls it, and the ablation and
sweep flows run it as a subflow per variant. The deployments' entry point, where the Prefect UI
edits a config path and overrides, parses them once and runs the same body inside its own flow
run (``experiment.fn``, in ``flows.deploy``).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from core.config import Config, stamp_trial
from core.runtime.job import Pipeline, StageProgress, trained_by
from core.runtime.run_lock import lock_run
from core.runtime.tensorboard import tensorboard_dir
from core.runtime.trainer import EvalCallback
from core.storage import join, local_path
from flows.progress import run_log_progress
from tasks.mlflow_tracking import MLflowSink, log_summary, run_url, start_run, tracking_uri
from tasks.redacted_flow import redacted_flow
from tasks.stages import prefect_stage


def summary_markdown(summary: dict[str, Any], run_id: str, url: str | None = None) -> str:
    """The summary table shown in Prefect (and close to what the CLI prints).

    ``url`` is the run's page in the MLflow UI (a tracking server): the run id links to it.
    """

    def fmt(value: Any) -> str:
        return "—" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [
        ("algorithm", summary["algorithm"]),
        ("staleness bound η", summary["max_staleness"]),
        ("held-out problems", summary["data"]["n_test"]),
        (f"accuracy before {trained_by(summary)}", summary.get("accuracy_before")),
        (f"accuracy after {trained_by(summary)}", summary.get("accuracy_after")),
        ("RL steps", summary.get("steps")),
        ("samples/s", summary.get("samples_per_s")),
        ("learner busy fraction", summary.get("learner_busy_fraction")),
        (
            "mean / max staleness",
            f"{fmt(summary.get('mean_staleness'))} / {fmt(summary.get('max_staleness_seen'))}",
        ),
        ("wall seconds", summary.get("wall_seconds")),
        ("MLflow run", f"[{run_id}]({url})" if url else run_id),
        ("checkpoints", summary.get("checkpoint_url")),
        ("run folder", summary["run_dir"]),
    ]
    if "preference_accuracy_before" in summary:  # a DPO stage ran
        rows[5:5] = [
            ("preference accuracy before", summary["preference_accuracy_before"]),
            ("preference accuracy after", summary["preference_accuracy_after"]),
        ]
    lines = [f"# {summary['experiment']} / {summary['trial']}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {fmt(value)} |" for name, value in rows]
    return "\n".join(lines) + "\n"


# Parameters are live objects (a Config, callbacks): Prefect records them, and needs no validation.
@redacted_flow(name="experiment", validate_parameters=False)
def experiment(
    config: Config,
    parent_run_id: str | None = None,
    run_name: str | None = None,
    progress: StageProgress | None = None,
    on_eval: EvalCallback | None = None,
) -> dict[str, Any]:
    """Run one experiment; returns the MLflow run id, the checkpoint URL and the summary.

    ``parent_run_id`` nests the MLflow run (an ablation's or sweep's child); ``progress`` and
    ``on_eval`` are the pipeline's hooks (a progress display; Optuna's pruning callback).
    """
    stamp_trial(config)
    name = run_name or f"{config.method}-{config.experiment.trial}"
    with ExitStack() as scope:
        if progress is None:  # no display of the caller's: progress lines in the run's log
            progress = scope.enter_context(run_log_progress())
        return _experiment(config, name, parent_run_id, progress, on_eval)


def _experiment(
    config: Config,
    name: str,
    parent_run_id: str | None,
    progress: StageProgress | None,
    on_eval: EvalCallback | None,
) -> dict[str, Any]:
    # The run folder's lock first: a job on a busy folder fails before it opens an MLflow run.
    with lock_run(config), start_run(config, run_name=name, parent_run_id=parent_run_id) as run:
        run_id = run.info.run_id
        uri = tracking_uri(config)
        url = run_url(uri, run.info.experiment_id, run_id)
        ids = {
            "mlflow_run_id": run_id,
            "mlflow_tracking_uri": uri,
            **({"mlflow_run_url": url} if url else {}),
            "prefect_flow_run_id": str(flow_run.id or ""),
        }
        pipeline = Pipeline(
            config,
            prefect_stage,
            [MLflowSink(run_id)],
            progress=progress,
            on_eval=on_eval,
            lock=False,
        )
        summary = pipeline.run(extra=ids)
        timeline = local_path(join(config.run_dir, "timeline"))
        plots = {f"timeline/{f.name}": f for f in sorted(timeline.glob("timeline.*"))}
        folders = {"tensorboard": tensorboard_dir(config)} if config.tracking.tensorboard else {}
        log_summary(run_id, summary, plots, folders=folders)
        create_markdown_artifact(
            markdown=summary_markdown(summary, run_id, url),
            key="experiment-summary",
            description=f"{config.experiment.name}/{config.experiment.trial}",
        )
    return {
        "mlflow_run_id": run_id,
        "checkpoint_url": summary.get("checkpoint_url"),
        "summary": summary,
    }
