"""Async vs sync: the same RL run at staleness bounds η = 0 (synchronous) … 8, on two tasks.

    python experiments/benchmarks/async_vs_sync.py                 # both tasks, η ∈ {0,1,2,4,8}
    asyncrl bench async_vs_sync --tasks agent --etas 0,4           # the same through the CLI

Tasks: ``math`` (experiments/quickstart.yaml) and ``agent`` (experiments/agent_tools.yaml: a
tool-calling agent whose calculator answers after 0.5 s). Per task one SFT warm start is trained
(or given with ``--model TASK=DIR``) and every setting starts RL from it through the bare core
loop. η = 0 runs with 1 and with 2 torch threads per process (rollout and learner take turns, so
sync may use both cores in each phase); the faster one is the baseline.

Reported per setting: trained samples/s and tokens/s (over training steps; evals excluded),
learner busy fraction, per-step time split, held-out accuracy before/after, RL seconds to reach
the task's target accuracy (eval pauses excluded), mean/max staleness. Two ceilings per task:

- overlap ceiling (T_gen + T_train) / max(T_gen, T_train) from the best sync run's own phases:
  what overlap alone could buy if each phase kept its speed while sharing the machine;
- learner bound: best-sync step time / the 1-thread learner's step time (train + publish, from
  the 1-thread sync run). Async puts the learner on one core and the rollout on the other, so
  it cannot step faster than that learner.

Writes ``results.json``, ``throughput_vs_eta.png`` and ``accuracy_vs_time.png`` under ``--out``
and logs them, with one nested MLflow run per setting (per-step metrics), to the tracking store
of the task configs (``{fileroot}/mlflow.db``, experiment ``benchmarks``).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from core.config import ConfigSource
from core.runtime.job import run_experiment
from core.runtime.metrics import MemorySink
from experiments.benchmarks._common import bench_source, best_per_eta, save_results, warm_start
from tasks.mlflow_tracking import MLflowSink, start_run

logger = logging.getLogger("bench")


@dataclass(frozen=True)
class TaskSpec:
    """One benchmark task: its config, RL length, eval cadence and time-to-target accuracy."""

    config: str
    steps: int
    eval_every: int
    target: float


TASKS = {
    "math": TaskSpec("experiments/quickstart.yaml", steps=20, eval_every=5, target=0.45),
    "agent": TaskSpec("experiments/agent_tools.yaml", steps=10, eval_every=2, target=0.6),
}


def task_source(task: TaskSpec, args: argparse.Namespace) -> ConfigSource:
    """The task's config with its RL length and eval cadence, then the user's overrides (which
    win), parsed once; every setting of the task resolves from it."""
    head = [
        f"learner.total_steps={task.steps}",
        f"eval.every_n_steps={task.eval_every}",
        "rollout.adaptive_staleness=false",  # η is the setting under test, not just a ceiling
    ]
    return bench_source(task.config, head, args)


def run_setting(
    task: TaskSpec,
    source: ConfigSource,
    model_dir: str,
    eta: int,
    threads: int,
    parent_id: str,
    name: str,
    extra: dict[str, Any] | None = None,
    label: str = "",
) -> dict[str, Any]:
    """One RL run from the warm start (the experiment pipeline, no SFT); a nested MLflow run
    gets its per-step metrics. ``extra`` overrides more of the config for this run only, and
    ``label`` (e.g. ``lat0.5-seed2``) tells such runs apart in their trial name."""
    trial = f"eta{eta}-t{threads}" + (f"-{label}" if label else "")
    setting = {
        "rollout.max_staleness": eta,
        "scheduler.torch_threads": threads,
        "experiment.trial": trial,
        "checkpoint.every_n_steps": 0,
        "sft.enabled": False,
        "model.path": model_dir,
        **(extra or {}),
    }
    cfg = source.resolve(setting, label=f"setting {trial}")
    memory = MemorySink()
    tags = {"kind": "benchmark", "task": name}
    with start_run(cfg, run_name=f"{name}/{trial}", parent_run_id=parent_id, tags=tags) as run:
        mlflow_sink = MLflowSink(run.info.run_id)
        started = time.perf_counter()
        s = run_experiment(cfg, sinks=[memory, mlflow_sink])
        n = max(s["steps"], 1)
        row = {
            "task": name,
            "setting": f"eta{eta}-t{threads}",
            "trial": trial,
            "eta": eta,
            "threads": threads,
            "steps": s["steps"],
            "samples_per_s": s["samples_per_s"],
            "tokens_per_s": s["tokens_per_s"],
            "learner_busy_fraction": s["learner_busy_fraction"],
            "gen_wait_s_per_step": s["wait_rollout_s"] / n,
            "train_s_per_step": s["train_s"] / n,
            "publish_s_per_step": s["publish_s"] / n,
            "step_s": _mean(v for _, v in memory.series("time/step_s")),
            "step_s_each": [v for _, v in memory.series("time/step_s")],
            "after_first_samples_per_s": _after_first_step(memory),
            "accuracy_start": s["evals"][0]["accuracy"],
            "accuracy_final": s["evals"][-1]["accuracy"],
            "evals": _train_time_evals(s["evals"]),
            "mean_staleness": _mean(v for _, v in memory.series("staleness/mean")),
            "max_staleness": max((v for _, v in memory.series("staleness/max")), default=0.0),
            "wall_s": time.perf_counter() - started,
            "diagnostics": _diagnostics(memory),
            "mlflow_run_id": run.info.run_id,
            "final_model_dir": s["final_model_dir"],
            "final_window": s["rollout"].get("window"),  # the submission bound at the end
        }
        row["time_to_target_s"] = _first_at(row["evals"], task.target)
        bench = {f"bench/{k}": v for k, v in row.items() if isinstance(v, float | int)}
        mlflow_sink.log_metrics(bench, s["steps"])
    return row


def _diagnostics(memory: MemorySink) -> dict[str, float]:
    """Mean over the run's steps of the objective's statistics (``actor/``: clip and behaviour
    weight figures, KL estimates) and of the staleness figures."""
    names = sorted(
        {k for row in memory.rows for k in row if k.startswith(("actor/", "staleness/"))}
    )
    return {name: _mean(v for _, v in memory.series(name)) for name in names}


def _after_first_step(memory: MemorySink) -> float | None:
    """Samples/s over the steps after the first: the rate once the pipeline is full. An
    asynchronous run's first batch waits for episodes started from nothing, as a synchronous
    one's does, so over a few steps it weighs on the whole-run figure; None for one step."""
    seconds = [s for _, s in memory.series("time/step_s")][1:]
    rates = [r for _, r in memory.series("throughput/samples_per_s")][1:]
    total = sum(seconds)
    return sum(r * s for r, s in zip(rates, seconds, strict=True)) / total if total else None


def _train_time_evals(evals: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Each eval with ``train_s``: RL wall seconds before it without eval and checkpoint pauses
    (the trainer's ``rl_s``); the first eval runs before the RL clock starts."""
    return [
        {"version": e["version"], "accuracy": e["accuracy"], "train_s": e["rl_s"] if i else 0.0}
        for i, e in enumerate(evals)
    ]


def _first_at(evals: list[dict[str, float]], target: float) -> float | None:
    hits = [e["train_s"] for e in evals if e["accuracy"] >= target]
    return min(hits) if hits else None


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def run_task(
    name: str, task: TaskSpec, source: ConfigSource, args: argparse.Namespace, parent_id: str
) -> dict[str, Any]:
    model_dir = args.models.get(name)
    if model_dir is None:
        model_dir = warm_start(source.resolve({"experiment.trial": "bench-data"}), name)
    rows = []
    for eta in args.etas:
        for threads in args.sync_threads if eta == 0 else [1]:
            row = run_setting(task, source, model_dir, eta, threads, parent_id, name)
            rows.append(row)
            print(
                f"[{name}] {row['setting']}: {row['samples_per_s']:.1f} samples/s, busy "
                f"{row['learner_busy_fraction']:.2f}, accuracy {row['accuracy_start']:.3f} → "
                f"{row['accuracy_final']:.3f}",
                flush=True,
            )
    return summarize(name, task, rows, model_dir)


def summarize(name: str, task: TaskSpec, rows: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """Speed-ups against the best sync setting and the two ceilings (see the module docstring)."""
    syncs = [r for r in rows if r["eta"] == 0]
    sync = max(syncs, key=lambda r: r["samples_per_s"])
    t_gen = sync["gen_wait_s_per_step"]
    t_train = sync["train_s_per_step"] + sync["publish_s_per_step"]
    one_thread = [r for r in syncs if r["threads"] == 1]
    # An async step still trains and then publishes: both are the learner's time.
    learner_1t = (
        one_thread[0]["train_s_per_step"] + one_thread[0]["publish_s_per_step"]
        if one_thread
        else None
    )
    for row in rows:
        row["speedup_vs_best_sync"] = row["samples_per_s"] / sync["samples_per_s"]
    best_async = max(
        (r for r in rows if r["eta"] > 0), key=lambda r: r["samples_per_s"], default=None
    )
    return {
        "task": name,
        "config": task.config,
        "steps": rows[0]["steps"],
        "target_accuracy": task.target,
        "model": model,
        "rows": rows,
        "best_sync": sync["setting"],
        "best_async": best_async["setting"] if best_async else None,
        "T_gen_s": t_gen,
        "T_train_s": t_train,
        "overlap_ceiling": (t_gen + t_train) / max(t_gen, t_train, 1e-9),
        "learner_1thread_s": learner_1t,
        "learner_bound": sync["step_s"] / learner_1t if learner_1t else None,
    }


# ------------------------------------------------------------------------------ output
def print_table(report: dict[str, Any]) -> None:
    bound = report["learner_bound"]
    title = (
        f"{report['task']}: {report['steps']} RL steps · overlap ceiling "
        f"{report['overlap_ceiling']:.2f}× (T_gen {report['T_gen_s']:.2f} s, T_train "
        f"{report['T_train_s']:.2f} s/step) · learner bound "
        + (f"{bound:.2f}×" if bound else "n/a")
    )
    table = Table(title=title)
    for col in (
        "setting",
        "samples/s",
        "tokens/s",
        "× best sync",
        "busy",
        "gen wait s",
        "train s",
        "acc start → final",
        f"s to {report['target_accuracy']:.2f}",
        "staleness mean/max",
    ):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        ttt = "—" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
        table.add_row(
            r["setting"],
            f"{r['samples_per_s']:.1f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['speedup_vs_best_sync']:.2f}",
            f"{r['learner_busy_fraction']:.2f}",
            f"{r['gen_wait_s_per_step']:.2f}",
            f"{r['train_s_per_step']:.2f}",
            f"{r['accuracy_start']:.3f} → {r['accuracy_final']:.3f}",
            ttt,
            f"{r['mean_staleness']:.2f} / {r['max_staleness']:.0f}",
        )
    Console(width=160).print(table)


def plot_eta(reports: list[dict[str, Any]], path: Path) -> Path:
    """Throughput (× best sync) and final accuracy vs η, one line per task."""
    fig = Figure(figsize=(11, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    speed, acc = fig.subplots(1, 2)
    for i, report in enumerate(reports):
        best = best_per_eta(report["rows"])
        etas = list(best)
        color = f"C{i}"
        speed.plot(
            etas,
            [best[e]["speedup_vs_best_sync"] for e in etas],
            marker="o",
            color=color,
            label=report["task"],
        )
        if report["learner_bound"]:
            speed.axhline(
                min(report["learner_bound"], report["overlap_ceiling"]),
                color=color,
                linestyle=":",
                linewidth=1,
                label=f"{report['task']} ceiling",
            )
        acc.plot(
            etas,
            [best[e]["accuracy_final"] for e in etas],
            marker="o",
            color=color,
            label=report["task"],
        )
    speed.set(
        xlabel="staleness bound η", ylabel="trained samples/s ÷ best sync", title="throughput vs η"
    )
    acc.set(
        xlabel="staleness bound η", ylabel="held-out accuracy after RL", title="final accuracy vs η"
    )
    for ax in (speed, acc):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


def plot_curves(reports: list[dict[str, Any]], path: Path) -> Path:
    """Held-out accuracy vs RL seconds (eval pauses excluded), one line per η, per task."""
    fig = Figure(figsize=(5.5 * len(reports), 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(reports), squeeze=False)[0]
    for ax, report in zip(axes, reports, strict=True):
        for i, (eta, row) in enumerate(best_per_eta(report["rows"]).items()):
            ax.plot(
                [e["train_s"] for e in row["evals"]],
                [e["accuracy"] for e in row["evals"]],
                marker="o",
                markersize=3,
                color=f"C{i}",
                label=f"η={eta} ({row['setting']})",
            )
        ax.axhline(report["target_accuracy"], color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel="RL seconds", ylabel="held-out accuracy", title=report["task"])
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


def _pairs(values: list[str]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, folder = value.partition("=")
        if not sep or key not in TASKS:
            raise SystemExit(
                f"--model expects TASK=DIR with TASK in {sorted(TASKS)}, got {value!r}"
            )
        out[key] = folder
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="math,agent", help=f"comma-separated, from {sorted(TASKS)}")
    p.add_argument("--etas", default="0,1,2,4,8", help="staleness bounds; 0 = synchronous")
    p.add_argument("--sync-threads", default="1,2", help="torch threads tried for η = 0")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="TASK=DIR",
        help="a warm-started HF folder for TASK (skips its SFT)",
    )
    p.add_argument("--fileroot", default="runs", help="cluster.fileroot of the runs (MLflow too)")
    p.add_argument("--out", default="runs/benchmarks/async_vs_sync", help="JSON and plots")
    p.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    args = p.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        p.error(f"--tasks: unknown {unknown}; choose from {sorted(TASKS)}")
    args.etas = [int(e) for e in args.etas.split(",")]
    args.sync_threads = [int(t) for t in args.sync_threads.split(",")]
    if 0 not in args.etas:
        p.error("--etas must include 0: the synchronous baseline")
    args.models = _pairs(args.model)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # Every config validates before any work starts.
    sources = {name: task_source(TASKS[name], args) for name in args.tasks}
    configs = [source.resolve() for source in sources.values()]
    if any(cfg.learner.total_steps < 1 for cfg in configs):
        raise SystemExit("learner.total_steps must be >= 1: the benchmark measures RL steps")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with start_run(
        configs[0], run_name=f"async-vs-sync-{stamp}", tags={"kind": "benchmark"}
    ) as parent:
        reports = [
            run_task(name, TASKS[name], sources[name], args, parent.info.run_id)
            for name in args.tasks
        ]
        plots = [
            plot_eta(reports, out / "throughput_vs_eta.png"),
            plot_curves(reports, out / "accuracy_vs_time.png"),
        ]
        payload = {"tasks": reports, "etas": args.etas, "mlflow_run_id": parent.info.run_id}
        save_results(out, payload, plots, parent.info.run_id)
        for report in reports:
            headline = {
                "overlap_ceiling": report["overlap_ceiling"],
                "learner_bound": report["learner_bound"],
                **{
                    f"speedup_eta{r['eta']}_t{r['threads']}": r["speedup_vs_best_sync"]
                    for r in report["rows"]
                },
            }
            mlflow.log_metrics(
                {f"{report['task']}/{k}": v for k, v in headline.items() if v is not None}
            )
    for report in reports:
        print_table(report)
    print(f"results: {out} · MLflow run {parent.info.run_id}")


if __name__ == "__main__":
    main()
