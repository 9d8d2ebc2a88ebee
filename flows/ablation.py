"""Algorithm ablation: algorithms × seeds as experiment subflows under one MLflow parent run,
then a comparison report (curves PNG + table) logged to MLflow and as a Prefect artifact."""

from __future__ import annotations

import time
from typing import Any

import mlflow
from prefect.artifacts import create_markdown_artifact

from core.config import Config, ConfigSource
from core.storage import join, local_path, upload_dir, write_json
from flows.experiment import experiment
from tasks.comparison_report import collect_runs, comparison_table, plot_curves, render_markdown
from tasks.mlflow_tracking import start_run, tracking_uri
from tasks.redacted_flow import redacted_flow

DEFAULT_ALGORITHMS = ("grpo", "ppo", "dapo")


def ablation_variants(
    source: ConfigSource, algorithms: list[str], seeds: int, stamp: str = ""
) -> list[Config]:
    """One resolved config per algorithm × seed (seeds counted up from the config's own seed);
    raises ConfigError naming the first variant that does not validate."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    first = source.resolve().experiment.seed
    return [
        source.resolve(
            {
                "algorithm": algorithm,
                "experiment.seed": seed,
                "experiment.trial": f"{stamp}-{algorithm}-s{seed}",
            },
            label=f"variant algorithm={algorithm}",
        )
        for algorithm in algorithms
        for seed in range(first, first + seeds)
    ]


@redacted_flow(name="ablation", validate_parameters=False)
def ablation(
    source: ConfigSource, algorithms: list[str] | None = None, seeds: int = 1
) -> dict[str, Any]:
    """Run every algorithm with ``seeds`` seeds; returns the parent run id, table and plot path."""
    algorithms = list(algorithms or DEFAULT_ALGORITHMS)
    base = source.resolve({"algorithm": algorithms[0]})
    stamp = base.experiment.trial or time.strftime("%Y%m%d-%H%M%S")
    variants = ablation_variants(source, algorithms, seeds, stamp)
    with start_run(base, run_name=f"ablation-{stamp}", tags={"kind": "ablation"}) as parent:
        parent_id = parent.info.run_id
        runs = []
        for config in variants:
            algorithm, seed = config.algorithm.name, config.experiment.seed
            result = experiment.with_options(flow_run_name=config.experiment.trial)(
                config, parent_run_id=parent_id, run_name=f"{algorithm}-s{seed}"
            )
            runs.append(
                {
                    "algorithm": algorithm,
                    "seed": seed,
                    "mlflow_run_id": result["mlflow_run_id"],
                    "checkpoint_url": result["checkpoint_url"],
                }
            )
        experiment_name = base.tracking.mlflow_experiment or base.experiment.name
        records = collect_runs(tracking_uri(base), experiment_name, parent_run_id=parent_id)
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
