"""Orchestration overhead: the same experiment as a bare core loop vs the Prefect flow + MLflow.

    python experiments/benchmarks/orchestration_overhead.py [--repeats 2] [key=value ...]

Every variant is the user-facing command, run as a subprocess: ``asyncrl run --plain`` (the core
loop, no Prefect, no MLflow); ``asyncrl run`` (a Prefect flow run on the temporary local server
Prefect starts for it, every metric in MLflow); and, unless ``--no-server``, ``asyncrl run`` with
``PREFECT_API_URL`` set to a Prefect server that is already up (as when runs are triggered from
the UI; the benchmark starts one with ``infra.stack`` and stops it). Runs alternate between the
variants so slow drift on a shared machine hits all of them.
Per run: the command's wall seconds, the job's own wall seconds (``summary.json``: data → SFT →
RL → eval, without interpreter start-up and server start/stop) and RL samples/s. The overhead is
reported as flow/plain ratios of both, and as the fixed cost (command − job) per variant.

Defaults shorten the quickstart (SFT 200 steps, 20 RL steps, no intermediate evals or
checkpoints) so a pair takes ~5 minutes; overrides after the options change that.
Writes ``results.json`` and ``overhead.png`` under ``--out`` and logs both to MLflow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from core.config import ConfigSource, parse_config
from tasks.mlflow_tracking import start_run

SHORT = [
    "sft.steps=200",
    "learner.total_steps=20",
    "eval.every_n_steps=0",
    "checkpoint.every_n_steps=0",
]
VARIANTS = {"plain": ["--plain"], "flow": [], "flow-server": []}


def run_once(
    variant: str,
    config: str,
    overrides: list[str],
    source: ConfigSource,
    trial: str,
    log_dir: Path,
    env: dict[str, str],
) -> dict[str, Any]:
    """One ``asyncrl run CONFIG OVERRIDES`` as a subprocess (``source`` is the same, parsed
    here); its output goes to ``log_dir/{trial}.log``."""
    run_dir = Path(source.resolve({"experiment.trial": trial}).run_dir)
    asyncrl = Path(sys.executable).with_name("asyncrl")
    cmd = [
        str(asyncrl),
        "run",
        *VARIANTS[variant],
        config,
        *overrides,
        f"experiment.trial={trial}",
    ]
    log = log_dir / f"{trial}.log"
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    command_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{variant} run failed (exit {proc.returncode}); see {log}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "variant": variant,
        "trial": trial,
        "command_s": command_s,
        "job_s": summary["wall_seconds"],
        "fixed_s": command_s - summary["wall_seconds"],
        "samples_per_s": summary.get("samples_per_s"),
        "log": str(log),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["variant"] == variant)

    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    out: dict[str, Any] = {
        v: {k: median(v, k) for k in ("command_s", "job_s", "fixed_s", "samples_per_s")}
        for v in variants
    }
    for v in variants[1:]:
        suffix = "" if v == "flow" else f"_{v.replace('-', '_')}"
        out[f"command_ratio{suffix}"] = out[v]["command_s"] / out["plain"]["command_s"]
        out[f"job_ratio{suffix}"] = out[v]["job_s"] / out["plain"]["job_s"]
    return out


def _ratios(summary: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in summary.items() if "ratio" in k}


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    ratios = ", ".join(f"{k} {v:.3f}×" for k, v in _ratios(summary).items())
    table = Table(title=f"orchestration overhead vs plain · {ratios}")
    for col in ("run", "command s", "job s", "command − job s", "RL samples/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["trial"],
            f"{r['command_s']:.1f}",
            f"{r['job_s']:.1f}",
            f"{r['fixed_s']:.1f}",
            f"{r['samples_per_s']:.1f}",
        )
    Console(width=140).print(table)


def plot(summary: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(9, 3.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    names = [v for v in VARIANTS if v in summary]
    jobs = [summary[v]["job_s"] for v in names]
    fixed = [summary[v]["fixed_s"] for v in names]
    ax.barh(names, jobs, label="job (data → SFT → RL → eval)")
    ax.barh(names, fixed, left=jobs, label="interpreter, server start/stop")
    ax.set(
        xlabel="seconds (median)",
        title=f"flow/plain: command {summary['command_ratio']:.3f}×, "
        f"job {summary['job_ratio']:.3f}×",
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path)
    return path


@contextlib.contextmanager
def prefect_server(enabled: bool, state_dir: Path) -> Iterator[dict[str, str] | None]:
    """A Prefect server already up (``infra.stack``), as ``PREFECT_API_URL``; None if disabled."""
    if not enabled:
        yield None
        return
    from core.training.distributed import free_ports
    from infra.stack import stack_down, stack_up

    prefect, mlflow_port, s3 = free_ports(3)
    info = stack_up(state_dir, prefect_port=prefect, mlflow_port=mlflow_port, s3_port=s3)
    try:
        yield {"PREFECT_API_URL": info.env()["PREFECT_API_URL"]}
    finally:
        stack_down(state_dir)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/quickstart.yaml")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every variant")
    p.add_argument("--no-server", action="store_true", help="skip the flow-server variant")
    p.add_argument("--fileroot", default="runs/benchmarks/orchestration_overhead/runs")
    p.add_argument("--out", default="runs/benchmarks/orchestration_overhead")
    p.add_argument("overrides", nargs="*", help="config overrides after the short defaults")
    args = p.parse_args(argv)
    overrides = [
        *SHORT,
        *args.overrides,
        f"cluster.fileroot={args.fileroot}",
        "tracking.mlflow_experiment=benchmarks",
    ]
    source = parse_config(args.config, overrides)
    cfg = source.resolve()  # validates first
    if cfg.learner.total_steps < 1:
        p.error("learner.total_steps must be >= 1: the runs are compared on RL throughput too")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base_env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    rows = []
    with prefect_server(not args.no_server, out / "stack") as server_env:
        variants = {"plain": base_env, "flow": base_env}
        if server_env is not None:
            variants["flow-server"] = {**base_env, **server_env}
        for i in range(args.repeats):
            for variant, env in variants.items():
                row = run_once(
                    variant,
                    args.config,
                    overrides,
                    source,
                    f"ovh-{stamp}-{variant}{i}",
                    out,
                    env,
                )
                print(
                    f"{row['trial']}: command {row['command_s']:.1f} s, job {row['job_s']:.1f} s",
                    flush=True,
                )
                rows.append(row)
    summary = summarize(rows)
    results = out / "results.json"
    results.write_text(
        json.dumps({"rows": rows, "summary": summary, "overrides": overrides}, indent=2)
    )
    figure = plot(summary, out / "overhead.png")
    with start_run(cfg, run_name=f"orchestration-overhead-{stamp}", tags={"kind": "benchmark"}):
        mlflow.log_metrics(
            {
                **_ratios(summary),
                **{
                    f"{v}/{k}": summary[v][k]
                    for v in VARIANTS
                    if v in summary
                    for k in ("command_s", "job_s", "fixed_s")
                },
            }
        )
        mlflow.log_artifact(str(results))
        mlflow.log_artifact(str(figure))
    print_table(rows, summary)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
