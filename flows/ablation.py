"""Algorithm ablation: algorithms × seeds as experiment subflows under one MLflow parent run,
then a comparison report (curves PNG + table) logged to MLflow and as a Prefect artifact.

``parallel`` variants run at once, each in its own process (:mod:`flows.parallel`); ``"auto"``
fits them to this machine's cores, which on a small box means one after another, in this
process. Either way the runs, table and plot are in (algorithm, seed) order.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlflow
from prefect.artifacts import create_markdown_artifact

from core.config import Config, ConfigSource
from core.storage import join, local_path, upload_dir, write_json
from flows.experiment import experiment
from flows.parallel import (
    VariantJob,
    parse_parallel,
    prepare_shared_data,
    resolve_parallelism,
    run_all,
)
from tasks.comparison_report import (
    RunRecord,
    collect_runs,
    comparison_table,
    plot_curves,
    render_markdown,
)
from tasks.mlflow_tracking import start_run, tracking_uri
from tasks.redacted_flow import redacted_flow

logger = logging.getLogger(__name__)

DEFAULT_ALGORITHMS = ("grpo", "ppo", "dapo")


def variant_overrides(method: str) -> dict[str, Any]:
    """What one variant changes in the recipe: an RL preset name (``grpo``, ``ppo``, …) trains
    with that preset and no DPO stage; ``dpo`` runs the recipe's DPO stage and no RL. Every
    variant keeps the recipe's data, warm start and evaluation."""
    if method == "dpo":
        return {"dpo.enabled": True, "learner.total_steps": 0}
    return {"algorithm": method, "dpo.enabled": False}


def ablation_variants(
    source: ConfigSource, algorithms: list[str], seeds: int, stamp: str = ""
) -> list[Config]:
    """One resolved config per algorithm × seed (seeds counted up from the config's own seed;
    ``dpo`` among the algorithms: :func:`variant_overrides`); raises ConfigError naming the
    first variant that does not validate."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    first = source.resolve().experiment.seed
    return [
        source.resolve(
            {
                **variant_overrides(algorithm),
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
    source: ConfigSource,
    algorithms: list[str] | None = None,
    seeds: int = 1,
    parallel: int | str = "auto",
) -> dict[str, Any]:
    """Run every algorithm with ``seeds`` seeds, ``parallel`` at a time (``"auto"`` or a number);
    returns the parent run id, table and plot path."""
    requested = parse_parallel(parallel)
    algorithms = list(algorithms or DEFAULT_ALGORITHMS)
    base = source.resolve(variant_overrides(algorithms[0]))
    stamp = base.experiment.trial or time.strftime("%Y%m%d-%H%M%S")
    variants = ablation_variants(source, algorithms, seeds, stamp)
    n, why = resolve_parallelism(requested, variants)
    logger.info("ablation of %d variant(s), %d at a time: %s", len(variants), n, why)
    tags = {"kind": "ablation", "parallel": n}
    with start_run(base, run_name=f"ablation-{stamp}", tags=tags) as parent:
        parent_id = parent.info.run_id
        jobs = [
            VariantJob(
                name=f"{config.method}-s{config.experiment.seed}",
                config=config,
                parent_run_id=parent_id,
                run_name=f"{config.method}-s{config.experiment.seed}",
                flow_run_name=config.experiment.trial,
            )
            for config in variants
        ]
        if n == 1:
            results = [_run_here(job) for job in jobs]
        else:
            prepare_shared_data(variants)
            results = run_all(jobs, n)
        runs = [
            {
                "algorithm": job.config.method,
                "seed": job.config.experiment.seed,
                "mlflow_run_id": result["mlflow_run_id"],
                "checkpoint_url": result["checkpoint_url"],
            }
            for job, result in zip(jobs, results, strict=True)
        ]
        experiment_name = base.tracking.mlflow_experiment or base.experiment.name
        records = collect_runs(tracking_uri(base), experiment_name, parent_run_id=parent_id)
        records = _in_variant_order(records, algorithms)
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


def _run_here(job: VariantJob) -> dict[str, Any]:
    """One variant as a subflow in this process (the sequential path)."""
    return experiment.with_options(flow_run_name=job.flow_run_name)(
        job.config, parent_run_id=job.parent_run_id, run_name=job.run_name
    )


def _in_variant_order(records: list[RunRecord], algorithms: list[str]) -> list[RunRecord]:
    """(algorithm, seed) order, not start order: concurrent variants start in any order."""
    rank = {name: i for i, name in enumerate(algorithms)}
    return sorted(records, key=lambda r: (rank.get(r.algorithm, len(rank)), r.seed or 0))
