"""Agent latency: sync vs async RL on an agent as its tools get slower and long-tailed.

    python experiments/benchmarks/agent_latency.py          # η ∈ {0,1,2,4,8} × 3 latencies × 3 seeds
    asyncrl bench agent_latency --etas 0,4 --seeds 1 --latencies none,2/20 learner.total_steps=3
    asyncrl bench agent_latency --config experiments/agent_openai.yaml --target 0.35 ...

The task is ``--config``, by default ``experiments/agent_search.yaml``: multi-hop questions over
a generated encyclopedia, answered with ``search`` and ``open`` tools whose every call waits a
latency drawn
from a log-normal (``tools.latency_s`` its median, ``tools.latency_p99_s`` its
99th percentile). A latency setting ``MEDIAN/P99`` (seconds) sets both and cuts a call off at
the P99 (``tools.timeout_s``), so about 1% of calls come back as a timeout error the
agent sees; ``none`` answers at once. Every setting's config is validated before any work. A synchronous loop waits for the slowest episode of every
batch, tool calls included; an asynchronous one keeps generating and training meanwhile, so its
advantage should grow with the tail (the AReaL paper's argument for agents).

One SFT warm start is trained (or given with ``--model``) and every run starts RL from it
through the bare core loop, like ``async_vs_sync``. η = 0 runs with each of
``--sync-threads`` torch threads; the one with the higher mean throughput is the baseline.

Reported per latency and setting, as mean ± standard error over the seeds (``experiment.seed``
varies the RL data order and sampling; the warm start, corpus and questions are shared):
trained samples/s and its ratio to the best sync setting at the same latency, the same after the
first step (once the pipeline is full: an asynchronous run's first batch waits for episodes
started from nothing, as a synchronous one's does), seconds per step waiting for the batch and
training (the time split that says what bounds a setting), held-out accuracy after the same
number of RL steps, RL seconds to reach ``--target`` accuracy (eval pauses excluded; over the
seeds that reached it) and how many times sooner than the best sync setting that is (the
headline where RL learns: set the target before the runs, e.g. halfway from the warm start to
sync's final accuracy), learner busy fraction, mean and max staleness. The plot adds held-out
accuracy against RL seconds per setting (mean over the seeds at each eval), the shape of the
AReaL paper's training curves.

The η > 0 runs get :data:`ASYNC_SETTINGS` on top (the settings that made asynchrony pay here;
they matter only while generation overlaps training), then any ``--async-set KEY=VALUE``
(repeatable; later wins, e.g. ``--async-set inference.kv_after_update=recompute``).
``--reuse RESULTS`` (repeatable) takes the runs an earlier invocation's ``results.json`` has for
this invocation's latencies, settings and seeds instead of running them again (same warm start
and task overrides; an η > 0 run also the same async settings), so a grid can be extended by
seeds or η, resumed after an interruption, or async settings tried against a measured sync
baseline (``--etas`` may then leave out 0); the table, JSON and plot cover every run, reused or
not.

Writes ``results.json`` (after every run, with the runs so far: ``--reuse`` it to go on) and
``agent_latency.png`` under ``--out`` and logs them, with one nested MLflow run per (setting,
latency, seed), to the task config's tracking store (``{fileroot}/mlflow.db``, experiment
``benchmarks``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from core.runtime.stages import data_seed
from experiments.benchmarks._common import (
    aggregate_seeds,
    bench_source,
    best_per_eta,
    parse_seed_grid,
    plus_minus,
    save_results,
    seed_grid_parser,
    warm_start,
)
from experiments.benchmarks.async_vs_sync import TaskSpec, run_setting
from tasks.mlflow_tracking import start_run

CONFIG = "experiments/agent_search.yaml"
# For the η > 0 runs: four steps' episodes in flight, their conversations' KV caches kept,
# running requests held across a weight update on their KV cache (PipelineRL's in-flight update)
# instead of aborted and prefilled again, and at most 64 rows decoding so the oldest groups'
# calls go first. Measured at latency 2/20 over 10 steps (2026-12-02): 2.25 samples/s without
# the hold and the row cap, 4.14/4.62 with them (sync: 1.94/2.11).
ASYNC_SETTINGS = (
    "rollout.max_concurrent=512",
    "inference.prefix_cache_tokens=524288",
    "inference.kv_after_update=keep",
    "inference.max_batch_rows=64",
)


@dataclass(frozen=True)
class Latency:
    """One tool-latency setting: the log-normal's median and p99 in seconds (0/0 = none)."""

    median_s: float
    p99_s: float

    @classmethod
    def parse(cls, text: str) -> Latency:
        """``none``, ``MEDIAN`` (no tail) or ``MEDIAN/P99``."""
        if text == "none":
            return cls(0.0, 0.0)
        median, _, p99 = text.partition("/")
        try:
            latency = cls(float(median), float(p99 or 0))
        except ValueError:
            raise ValueError(f"--latencies: {text!r} is not none, MEDIAN or MEDIAN/P99") from None
        if latency.median_s < 0 or (latency.p99_s and latency.p99_s < latency.median_s):
            raise ValueError(f"--latencies: {text!r} needs 0 <= MEDIAN <= P99")
        return latency

    @property
    def label(self) -> str:
        if not self.median_s:
            return "none"
        return f"{self.median_s:g}/{self.p99_s:g}" if self.p99_s else f"{self.median_s:g}"

    def overrides(self) -> dict[str, float]:
        """The rollout settings: with a tail a call is cut off at the p99; without one the
        config's ``tools.timeout_s`` stays (no call reaches it)."""
        settings = {
            "tools.latency_s": self.median_s,
            "tools.latency_p99_s": self.p99_s,
        }
        if self.p99_s:
            settings["tools.timeout_s"] = self.p99_s
        return settings


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (latency, setting) over its seeds, compared with the best sync setting of
    the same latency (see ``aggregate_seeds``), with ``ttt_speedup_vs_sync``: the best sync
    setting's mean RL seconds to the target over this setting's (None unless both reached it in
    every seed), and ``curve``: accuracy against RL seconds, averaged over the seeds."""
    entries = aggregate_seeds(rows, by="latency")
    by_key = {(e["latency"], e["setting"]): e for e in entries}
    for e in entries:
        sync = by_key[(e["latency"], e["best_sync"])]
        reached = all(x["target_hits"] == len(x["seeds"]) for x in (e, sync))
        e["ttt_speedup_vs_sync"] = (
            sync["time_to_target_s"] / e["time_to_target_s"]
            if reached and e["time_to_target_s"]
            else None
        )
        runs = [r for r in rows if (r["latency"], r["setting"]) == (e["latency"], e["setting"])]
        e["curve"] = mean_curve([r.get("evals", []) for r in runs])
    return entries


def mean_curve(runs: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per eval index (evals at the same steps in every run): the seeds' mean RL seconds and
    mean held-out accuracy; as long as the shortest run."""
    return [
        {
            "train_s": sum(e["train_s"] for e in at) / len(at),
            "accuracy": sum(e["accuracy"] for e in at) / len(at),
        }
        for at in zip(*runs, strict=False)
    ]


# ------------------------------------------------------------------------------ output
def print_table(entries: list[dict[str, Any]], target: float, task: str = "search agent") -> None:
    steps = {e["steps"] for e in entries}  # the η > 0 runs may train more (--async-set)
    per_run = f", {steps.pop()} RL steps per run" if len(steps) == 1 else ""
    table = Table(title=f"{task}{per_run}: mean ± SE over seeds")
    for col in (
        "latency (median/p99 s)",
        "setting",
        "seeds",
        "samples/s",
        "× best sync",
        "after step 1 (× sync)",
        "s/step: wait + train",
        "busy",
        "final accuracy (steps)",
        "RL s in all",
        f"RL s to {target:.2f} (hits)",
        "× sooner than sync",
        "staleness mean/max",
    ):
        table.add_column(col, justify="right")
    for e in entries:
        ttt = plus_minus(e["time_to_target_s"], e["time_to_target_s_se"], ".0f")
        sooner = e.get("ttt_speedup_vs_sync")
        table.add_row(
            e["latency"],
            e["setting"],
            str(len(e["seeds"])),
            plus_minus(e["samples_per_s"], e["samples_per_s_se"], ".2f"),
            f"{e['speedup_vs_best_sync']:.2f}",
            _after_first(e),
            f"{e['gen_wait_s_per_step']:.1f} + {e['train_s_per_step']:.1f}",
            plus_minus(e["learner_busy_fraction"], e["learner_busy_fraction_se"], ".2f"),
            plus_minus(e["accuracy_final"], e["accuracy_final_se"], ".3f") + f" ({e['steps']})",
            f"{e['curve'][-1]['train_s']:.0f}" if e.get("curve") else "—",
            f"{ttt} ({e['target_hits']}/{len(e['seeds'])})",
            "—" if sooner is None else f"{sooner:.2f}",
            f"{e['mean_staleness']:.2f} / {e['max_staleness']:.0f}",
        )
    Console(width=220).print(table)


def _after_first(entry: dict[str, Any]) -> str:
    """Samples/s after the first step, mean ± SE, and its ratio to the best sync setting's."""
    mean, se = entry["after_first_samples_per_s"], entry["after_first_samples_per_s_se"]
    ratio = entry["after_first_speedup_vs_best_sync"]
    if math.isnan(mean):
        return "—"
    return plus_minus(mean, se, ".2f") + ("" if math.isnan(ratio) else f" ({ratio:.2f})")


def plot(entries: list[dict[str, Any]], path: Path) -> Path:
    """Throughput (× best sync) and final accuracy vs η, one line per latency (the
    best η = 0 setting stands for sync; error bars are standard errors), and held-out accuracy
    against RL seconds for every setting (one line style per latency)."""
    fig = Figure(figsize=(16, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    speed, acc, curves = fig.subplots(1, 3)
    styles = ("-", "--", ":", "-.")
    for i, latency in enumerate(dict.fromkeys(e["latency"] for e in entries)):
        for j, e in enumerate(e for e in entries if e["latency"] == latency):
            curve = e.get("curve") or []
            curves.plot(
                [c["train_s"] for c in curve],
                [c["accuracy"] for c in curve],
                marker="o",
                markersize=3,
                linestyle=styles[i % len(styles)],
                color=f"C{j}",
                label=f"{latency}: {e['setting']}",
            )
    curves.set(xlabel="RL seconds (evals excluded)", ylabel="held-out accuracy",
               title="accuracy against time")  # fmt: skip
    curves.legend(fontsize=7)
    curves.grid(alpha=0.3)
    for i, latency in enumerate(dict.fromkeys(e["latency"] for e in entries)):
        same = [e for e in entries if e["latency"] == latency]
        best = best_per_eta(same)
        etas = list(best)
        sync = best[0]["samples_per_s"]
        speed.errorbar(
            etas,
            [best[x]["speedup_vs_best_sync"] for x in etas],
            yerr=[(best[x]["samples_per_s_se"] or 0) / sync for x in etas],
            marker="o",
            capsize=3,
            color=f"C{i}",
            label=f"latency {latency}",
        )
        acc.errorbar(
            etas,
            [best[x]["accuracy_final"] for x in etas],
            yerr=[best[x]["accuracy_final_se"] or 0 for x in etas],
            marker="o",
            capsize=3,
            color=f"C{i}",
            label=f"latency {latency}",
        )
    speed.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    speed.set(xlabel="staleness bound η", ylabel="samples/s ÷ best sync", title="throughput")
    steps = sorted({e["steps"] for e in entries})
    acc.set(xlabel="staleness bound η", ylabel="held-out accuracy",
            title=f"final accuracy ({' or '.join(map(str, steps))} steps)")  # fmt: skip
    for ax in (speed, acc):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = seed_grid_parser(__doc__, "runs/benchmarks/agent_latency", sync_threads="1,2")
    p.add_argument(
        "--latencies",
        default="none,0.5/5,2/20",
        help="tool latency settings: none, MEDIAN or MEDIAN/P99 in seconds, comma-separated",
    )
    p.add_argument("--target", type=float, default=0.2, help="the time-to-accuracy target")
    p.add_argument(
        "--config",
        default=CONFIG,
        help="the agent's experiment YAML (its tool calls wait the latency settings)",
    )
    p.add_argument(
        "--async-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the η > 0 runs only, after ASYNC_SETTINGS (repeatable)",
    )
    p.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="RESULTS_JSON",
        help="take the runs an earlier results.json has for this grid instead of running them "
        "(repeatable)",
    )

    def latencies(args: argparse.Namespace) -> None:
        args.latencies = [Latency.parse(t) for t in args.latencies.split(",")]

    args = parse_seed_grid(p, argv, latencies, sync_elsewhere=lambda args: bool(args.reuse))
    args.async_set = [*ASYNC_SETTINGS, *args.async_set]
    return args


def _settings(*overrides: list[str]) -> dict[str, str]:
    """``key=value`` overrides as one mapping, later ones winning: what they set, whatever their
    order or repeats."""
    return dict(o.split("=", 1) for group in overrides for o in group)


def reused_runs(paths: list[str], args: argparse.Namespace) -> tuple[str | None, list[dict]]:
    """The warm start and the runs of earlier ``results.json`` files that this invocation's grid
    asks for (latency × setting × seed; the first file that has one wins), refused (naming the
    file and what differs) unless each ran the same task from the same warm start (``--model``,
    if given, and each other's) with the same overrides; an η > 0 run is taken only if its async
    settings came to the same as this invocation's."""
    model, rows, have = args.model, [], set()
    mine = _settings(args.overrides)
    mine_async = _settings(args.overrides, args.async_set)
    latencies = {lat.label for lat in args.latencies}
    for path in paths:
        file = Path(path)
        try:
            earlier = json.loads(file.read_text())
            runs, theirs = earlier["runs"], _settings(earlier["overrides"])
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"--reuse {file}: not an agent_latency results.json ({err})") from None
        if earlier.get("config") != args.config:
            raise SystemExit(
                f"--reuse {file}: its config {earlier.get('config')!r} is not {args.config}"
            )
        their_model = str(earlier.get("model"))
        if model and Path(model).resolve() != Path(their_model).resolve():
            raise SystemExit(
                f"--reuse {file}: its model {their_model!r} is not this run's {model!r}"
            )
        model = their_model
        if theirs != mine:
            raise SystemExit(
                f"--reuse {file}: its overrides {earlier['overrides']!r} are not this run's "
                f"{list(args.overrides)!r}"
            )
        for row in runs:
            key = (row["latency"], row["setting"], row["seed"])
            asked = (
                row["latency"] in latencies
                and (row["eta"] in args.etas or row["eta"] == 0)  # sync: the baseline
                and row["seed"] in args.seeds
                and (row["eta"] > 0 or row["threads"] in args.sync_threads)
            )
            async_set = row.get("async_set", earlier.get("async_set", []))
            same = row["eta"] == 0 or _settings(earlier["overrides"], async_set) == mine_async
            if asked and same and key not in have:
                have.add(key)
                rows.append(row)
    if 0 not in args.etas:
        synced = {r["latency"] for r in rows if r["eta"] == 0}
        if missing := sorted(latencies - synced):
            raise SystemExit(f"--reuse: no η = 0 run at latency {', '.join(missing)}")
    return model, rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    source = bench_source(args.config, [], args)
    async_source = bench_source(args.config, [], args, more=args.async_set)
    # Every setting's config, and the baseline, validate before any work starts.
    for latency in args.latencies:
        cfg = source.resolve(latency.overrides(), label=f"latency {latency.label}")
        async_source.resolve(latency.overrides(), label=f"latency {latency.label} (--async-set)")
    reused_model, reused = reused_runs(args.reuse, args)
    done = {(r["latency"], r["setting"], r["seed"]) for r in reused}
    if cfg.learner.total_steps < 1:
        raise SystemExit("learner.total_steps must be >= 1: the benchmark measures RL steps")
    task = TaskSpec(args.config, cfg.learner.total_steps, cfg.eval.every_n_steps, args.target)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with start_run(cfg, run_name=f"agent-latency-{stamp}", tags={"kind": "benchmark"}) as parent:
        model_dir = (
            args.model
            or reused_model
            or warm_start(source.resolve({"experiment.trial": "bench-data"}), cfg.experiment.name)
        )
        head = {
            "config": args.config,
            "model": model_dir,
            "overrides": list(args.overrides),
            "async_set": list(args.async_set),
            "reused": [str(Path(p).resolve()) for p in args.reuse],
            "target_accuracy": args.target,
            "mlflow_run_id": parent.info.run_id,
        }
        rows = list(reused)
        for latency in args.latencies:
            for eta in args.etas:
                for threads in args.sync_threads if eta == 0 else [1]:
                    for seed in args.seeds:
                        if (latency.label, f"eta{eta}-t{threads}", seed) in done:
                            continue
                        row = run_setting(
                            task,
                            async_source if eta else source,
                            model_dir,
                            eta,
                            threads,
                            parent.info.run_id,
                            cfg.experiment.name,
                            extra={
                                **latency.overrides(),
                                "experiment.seed": seed,
                                "data.seed": data_seed(cfg),
                            },
                            label=f"lat{latency.label.replace('/', '-')}-seed{seed}",
                        )
                        row |= {"latency": latency.label, "seed": seed}
                        if eta:
                            row["async_set"] = list(args.async_set)
                        rows.append(row)
                        # the runs so far, for --reuse if this invocation is cut short
                        partial = {**head, "complete": False, "runs": rows}
                        (out / "results.json").write_text(json.dumps(partial, indent=2))
                        print(
                            f"[latency {latency.label}] {row['trial']}: "
                            f"{row['samples_per_s']:.2f} samples/s, busy "
                            f"{row['learner_busy_fraction']:.2f}, accuracy "
                            f"{row['accuracy_start']:.3f} → {row['accuracy_final']:.3f}",
                            flush=True,
                        )
        entries = aggregate(rows)
        payload = {**head, "complete": True, "summary": entries, "runs": rows}
        save_results(out, payload, [plot(entries, out / "agent_latency.png")], parent.info.run_id)
        mlflow.log_metrics(
            {
                f"lat{e['latency'].replace('/', '-')}/{name}_{e['setting']}": e[key]
                for e in entries
                for name, key in (
                    ("speedup", "speedup_vs_best_sync"),
                    ("sooner_to_target", "ttt_speedup_vs_sync"),
                )
                if e.get(key) is not None
            }
        )
    print_table(entries, args.target, cfg.experiment.name)
    print(f"results: {out} · MLflow run {parent.info.run_id}")


if __name__ == "__main__":
    main()
