"""Orchestration overhead: the same experiment as a bare core loop vs the Prefect flow + MLflow.

    python experiments/benchmarks/orchestration_overhead.py [--repeats 2] [key=value ...]

Both variants are the user-facing command, run as a subprocess: ``asyncrl run --plain`` (the core
loop, no Prefect, no MLflow) and ``asyncrl run`` (a Prefect flow run on a temporary local server,
every metric in MLflow). Runs alternate plain/flow so slow drift on a shared machine hits both.
Per run: the command's wall seconds, the job's own wall seconds (``summary.json``: data → SFT →
RL → eval, without interpreter start-up and server start/stop) and RL samples/s. The overhead is
reported as flow/plain ratios of both, and as the fixed cost (command − job) per variant.

Defaults shorten the quickstart (SFT 200 steps, 20 RL steps, no intermediate evals or
checkpoints) so a pair takes ~5 minutes; overrides after the options change that.
Writes ``results.json`` and ``overhead.png`` under ``--out`` and logs both to MLflow.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlflow
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from core.config import load_config
from tasks.tracking import start_run

SHORT = ["sft.steps=200", "actor.total_steps=20", "eval.every_n_steps=0",
         "checkpoint.every_n_steps=0"]
VARIANTS = {"plain": ["--plain"], "flow": []}


def run_once(variant: str, config: str, overrides: list[str], fileroot: str, trial: str,
             log_dir: Path) -> dict[str, Any]:
    """One ``asyncrl run`` as a subprocess; its output goes to ``log_dir/{trial}.log``."""
    asyncrl = Path(sys.executable).with_name("asyncrl")
    cmd = [str(asyncrl), "run", *VARIANTS[variant], config, *overrides,
           f"cluster.fileroot={fileroot}", f"experiment.trial={trial}"]
    log = log_dir / f"{trial}.log"
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    command_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{variant} run failed (exit {proc.returncode}); see {log}")
    run_dir = Path(load_config(config, [*overrides, f"cluster.fileroot={fileroot}",
                                        f"experiment.trial={trial}"]).run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"variant": variant, "trial": trial, "command_s": command_s,
            "job_s": summary["wall_seconds"], "fixed_s": command_s - summary["wall_seconds"],
            "samples_per_s": summary.get("samples_per_s"), "log": str(log)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["variant"] == variant)

    out: dict[str, Any] = {v: {k: median(v, k) for k in ("command_s", "job_s", "fixed_s",
                                                          "samples_per_s")} for v in VARIANTS}
    out["command_ratio"] = out["flow"]["command_s"] / out["plain"]["command_s"]
    out["job_ratio"] = out["flow"]["job_s"] / out["plain"]["job_s"]
    return out


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    table = Table(title=f"orchestration overhead · flow/plain: command "
                        f"{summary['command_ratio']:.3f}×, job {summary['job_ratio']:.3f}×")
    for col in ("run", "command s", "job s", "command − job s", "RL samples/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["trial"], f"{r['command_s']:.1f}", f"{r['job_s']:.1f}",
                      f"{r['fixed_s']:.1f}", f"{r['samples_per_s']:.1f}")
    Console(width=120).print(table)


def plot(summary: dict[str, Any], path: Path) -> Path:
    fig = Figure(figsize=(6, 3.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    names = list(VARIANTS)
    jobs = [summary[v]["job_s"] for v in names]
    fixed = [summary[v]["fixed_s"] for v in names]
    ax.barh(names, jobs, label="job (data → SFT → RL → eval)")
    ax.barh(names, fixed, left=jobs, label="start-up / shutdown")
    ax.set(xlabel="seconds (median)", title=f"flow/plain: {summary['command_ratio']:.3f}×")
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/quickstart.yaml")
    p.add_argument("--repeats", type=int, default=1, help="plain/flow pairs")
    p.add_argument("--fileroot", default="runs/benchmarks/orchestration_overhead/runs")
    p.add_argument("--out", default="runs/benchmarks/orchestration_overhead")
    p.add_argument("overrides", nargs="*", help="config overrides after the short defaults")
    args = p.parse_args(argv)
    overrides = [*SHORT, *args.overrides]
    cfg = load_config(args.config, [*overrides, f"cluster.fileroot={args.fileroot}",
                                    "tracking.mlflow_experiment=benchmarks"])  # validates first
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for i in range(args.repeats):
        for variant in VARIANTS:
            row = run_once(variant, args.config, overrides, args.fileroot,
                           f"ovh-{stamp}-{variant}{i}", out)
            print(f"{row['trial']}: command {row['command_s']:.1f} s, job {row['job_s']:.1f} s",
                  flush=True)
            rows.append(row)
    summary = summarize(rows)
    results = out / "results.json"
    results.write_text(json.dumps({"rows": rows, "summary": summary, "overrides": overrides},
                                  indent=2))
    figure = plot(summary, out / "overhead.png")
    with start_run(cfg, run_name=f"orchestration-overhead-{stamp}", tags={"kind": "benchmark"}):
        mlflow.log_metrics({"command_ratio": summary["command_ratio"],
                            "job_ratio": summary["job_ratio"],
                            **{f"{v}/{k}": summary[v][k] for v in VARIANTS
                               for k in ("command_s", "job_s", "fixed_s")}})
        mlflow.log_artifact(str(results))
        mlflow.log_artifact(str(figure))
    print_table(rows, summary)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
