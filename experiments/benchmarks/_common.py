"""What several benchmarks share: one SFT warm start that every compared run starts from, and
mean ± standard error over the seeds of a setting."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlflow

from core.config import Config, ConfigSource, parse_config
from core.runtime.job import Pipeline

# Per-run figures that are averaged over the seeds of a setting (over those runs that have the
# figure: a results.json from before it existed lacks it).
SEED_METRICS = (
    "samples_per_s",
    "after_first_samples_per_s",
    "gen_wait_s_per_step",
    "train_s_per_step",
    "accuracy_start",
    "accuracy_final",
    "learner_busy_fraction",
    "mean_staleness",
    "wall_s",
)


def seed_grid_parser(doc: str, out: str, sync_threads: str) -> argparse.ArgumentParser:
    """The arguments of an η × seeds benchmark (``--etas``, ``--seeds``, ``--sync-threads``,
    ``--model``, ``--fileroot``, ``--out`` and the config overrides); add the script's own."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--etas", default="0,1,2,4,8", help="staleness bounds; 0 = synchronous")
    p.add_argument("--seeds", default="1,2,3", help="experiment.seed of the repeats")
    p.add_argument("--sync-threads", default=sync_threads, help="torch threads tried for η = 0")
    p.add_argument("--model", default=None, help="a warm-started HF folder (skips the SFT)")
    p.add_argument("--fileroot", default="runs", help="cluster.fileroot of the runs (MLflow too)")
    p.add_argument("--out", default=out, help="JSON and plot")
    p.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    return p


def parse_seed_grid(
    p: argparse.ArgumentParser,
    argv: list[str] | None,
    more: Callable[[argparse.Namespace], None] = lambda args: None,
    sync_elsewhere: Callable[[argparse.Namespace], bool] = lambda args: False,
) -> argparse.Namespace:
    """Parse, turn the comma lists into ints, then ``more(args)`` (its ``ValueError`` becomes a
    usage error, as a bad list does); η = 0 must be among the settings unless
    ``sync_elsewhere(args)`` says the baseline comes from somewhere else."""
    args = p.parse_args(argv)
    try:
        args.etas = [int(e) for e in args.etas.split(",")]
        args.seeds = [int(s) for s in args.seeds.split(",")]
        args.sync_threads = [int(t) for t in args.sync_threads.split(",")]
        more(args)
    except ValueError as e:
        p.error(str(e))
    if 0 not in args.etas and not sync_elsewhere(args):
        p.error("--etas must include 0: the synchronous baseline")
    return args


def bench_source(
    config: str, head: list[str], args: argparse.Namespace, more: Sequence[str] = ()
) -> ConfigSource:
    """``config`` with the benchmark's own settings (``head``), then the user's overrides (which
    win over them) and ``more`` of them, then the run folder and MLflow experiment
    ``benchmarks``; parsed (every key checked) once, so every run of the benchmark resolves
    from it."""
    return parse_config(
        config,
        [
            *head,
            *args.overrides,
            *more,
            f"cluster.fileroot={args.fileroot}",
            "tracking.mlflow_experiment=benchmarks",
        ],
    )


def save_results(out: Path, payload: dict[str, Any], plots: list[Path], run_id: str) -> Path:
    """``out/results.json``, logged with ``plots`` as artifacts of the MLflow run ``run_id``."""
    results = out / "results.json"
    results.write_text(json.dumps(payload, indent=2))
    client = mlflow.MlflowClient()
    for path in (results, *plots):
        client.log_artifact(run_id, str(path))
    return results


def warm_start(cfg: Config, label: str) -> str:
    """Run the pipeline's stages up to and including SFT once; returns the model's HF folder."""
    started = time.perf_counter()
    _, model_dir = Pipeline(cfg).warm_start()
    print(
        f"[{label}] SFT warm start: {time.perf_counter() - started:.0f} s → {model_dir}", flush=True
    )
    return model_dir


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error (sample stdev / sqrt n; None for one value)."""
    if not values:
        return math.nan, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def aggregate_seeds(rows: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """One entry per (``row[by]``, setting) over its seeds: mean ± SE of ``SEED_METRICS`` and of
    every ``diagnostics`` figure, RL seconds to the target over the seeds that reached it, and
    the comparison with the best sync setting (highest mean samples/s at η = 0) of the same
    ``row[by]``: its throughput ratio and the accuracy gap with the gap's standard error."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row[by], row["setting"]), []).append(row)
    out = []
    for (key, setting), runs in groups.items():
        entry: dict[str, Any] = {
            by: key,
            "setting": setting,
            "eta": runs[0]["eta"],
            "threads": runs[0]["threads"],
            "seeds": [r["seed"] for r in runs],
            "steps": runs[0]["steps"],
        }
        for metric in SEED_METRICS:
            values = [r[metric] for r in runs if r.get(metric) is not None]
            entry[metric], entry[f"{metric}_se"] = mean_se(values)
        entry["max_staleness"] = max(r["max_staleness"] for r in runs)
        hits = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
        entry["target_hits"] = len(hits)
        entry["time_to_target_s"], entry["time_to_target_s_se"] = (
            mean_se(hits) if hits else (None, None)
        )
        names = sorted({name for r in runs for name in r.get("diagnostics", {})})
        entry["diagnostics"] = {
            name: mean_se([r["diagnostics"][name] for r in runs if name in r["diagnostics"]])
            for name in names
        }
        out.append(entry)
    for key in {e[by] for e in out}:
        same = [e for e in out if e[by] == key]
        sync = max((e for e in same if e["eta"] == 0), key=lambda e: e["samples_per_s"])
        for entry in same:
            entry["best_sync"] = sync["setting"]
            entry["speedup_vs_best_sync"] = entry["samples_per_s"] / sync["samples_per_s"]
            # NaN where either lacks the figure
            entry["after_first_speedup_vs_best_sync"] = (
                entry["after_first_samples_per_s"] / sync["after_first_samples_per_s"]
            )
            entry["accuracy_gap_vs_sync"] = entry["accuracy_final"] - sync["accuracy_final"]
            ses = (entry["accuracy_final_se"], sync["accuracy_final_se"])
            entry["accuracy_gap_se"] = (
                math.hypot(*ses) if None not in ses and entry is not sync else None
            )
    return out


def best_per_eta(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The fastest row (highest ``samples_per_s``) of each η, by η: the one a plot shows."""
    best: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r["eta"] not in best or r["samples_per_s"] > best[r["eta"]]["samples_per_s"]:
            best[r["eta"]] = r
    return dict(sorted(best.items()))


def plus_minus(mean: float | None, se: float | None, fmt: str) -> str:
    """``mean ± se`` for a table cell; ``—`` for no value."""
    if mean is None or math.isnan(mean):
        return "—"
    return format(mean, fmt) + (f" ± {format(se, fmt)}" if se is not None else "")
