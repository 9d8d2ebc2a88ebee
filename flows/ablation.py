"""Algorithm ablation: algorithms × seeds as experiment subflows under one MLflow parent run,
then a comparison report (curves PNG + table) logged to MLflow and as a Prefect artifact."""

from __future__ import annotations

import time
from typing import Any

import mlflow
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from core.config import load_config
from core.storage import join, local_path, upload_dir, write_json
from flows.experiment import experiment
from tasks.compare import collect_runs, comparison_table, plot_curves, render_markdown
from tasks.tracking import start_run, tracking_uri

DEFAULT_ALGORITHMS = ("grpo", "ppo", "dapo")


@flow(name="ablation")
def ablation(
    config_path: str = "experiments/quickstart.yaml",
    overrides: list[str] | None = None,
    algorithms: list[str] | None = None,
    seeds: int = 1,
) -> dict[str, Any]:
    """Run every algorithm with ``seeds`` seeds; returns the parent run id, table and plot path."""
    overrides = list(overrides or [])
    algorithms = list(algorithms or DEFAULT_ALGORITHMS)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    base = load_config(config_path, [*overrides, f"algorithm={algorithms[0]}"])  # validates early
    for algorithm in algorithms[1:]:
        load_config(config_path, [*overrides, f"algorithm={algorithm}"])
    stamp = base.experiment.trial or time.strftime("%Y%m%d-%H%M%S")
    with start_run(base, run_name=f"ablation-{stamp}", tags={"kind": "ablation"}) as parent:
        parent_id = parent.info.run_id
        runs = []
        for algorithm in algorithms:
            for seed in range(base.experiment.seed, base.experiment.seed + seeds):
                trial = f"{stamp}-{algorithm}-s{seed}"
                result = experiment.with_options(flow_run_name=trial)(
                    config_path,
                    [
                        *overrides,
                        f"algorithm={algorithm}",
                        f"experiment.seed={seed}",
                        f"experiment.trial={trial}",
                    ],
                    parent_run_id=parent_id,
                    run_name=f"{algorithm}-s{seed}",
                )
                runs.append(
                    {
                        "algorithm": algorithm,
                        "seed": seed,
                        "mlflow_run_id": result["mlflow_run_id"],
                        "checkpoint_url": result["checkpoint_url"],
                    }
                )
        records = collect_runs(
            tracking_uri(base),
            base.tracking.mlflow_experiment or base.experiment.name,
            parent_run_id=parent_id,
        )
        table = comparison_table(records)
        out_url = join(base.cluster.fileroot, base.experiment.name, f"ablation-{stamp}")
        out = local_path(out_url)
        out.mkdir(parents=True, exist_ok=True)
        plot = plot_curves(records, out / "curves.png")
        markdown = render_markdown(table)
        (out / "comparison.md").write_text(markdown)
        client = mlflow.MlflowClient()
        client.log_artifact(parent_id, str(plot))
        client.log_artifact(parent_id, str(out / "comparison.md"))
        create_markdown_artifact(
            markdown=f"# Ablation {stamp}\n\n{markdown}", key="ablation-comparison"
        )
        summary = {
            "mlflow_parent_run_id": parent_id,
            "runs": runs,
            "table": table,
            "plot": str(plot),
            "output_dir": out_url,
        }
        write_json(join(out_url, "summary.json"), summary)
        upload_dir(out, out_url)  # plots and tables next to the summary (no-op when local)
    return summary
