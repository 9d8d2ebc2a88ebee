"""asyncrl vs TRL's GRPOTrainer: the same GRPO work on one box, interleaved, one evaluation.

    pip install -e '.[trl]'                  # trl==1.16.0; it brings no other new package
    python experiments/benchmarks/vs_trl.py  # 3 repeats × {TRL, asyncrl sync, η=4, adaptive η≤4}
    asyncrl bench vs_trl --repeats 1 --steps 10

The work is the math quickstart (``experiments/quickstart.yaml``): one SFT warm start (or
``--model``) that every run starts from, then ``--steps`` GRPO steps of ``rollout.batch_size``
prompts × ``algorithm.group_size`` samples. :data:`MATCHED` lists what is held equal; a config
whose algorithm TRL cannot match (a critic, KL, several minibatches, another loss) is refused
before any work. TRL runs in its own process (``_trl_grpo.py``) with the sync setting's torch
threads; asyncrl runs through the bare core loop like ``async_vs_sync``. Within a repeat the
systems run in a rotated order (so drift on a shared box spreads over all of them), each
repeat with its own seed.

Throughput is trained samples per second of step time (generation, scoring and update; evals,
model loading and saving excluded, for both). Accuracy is one function for every final model:
``core.runtime.stages.evaluate_model`` (greedy, ``eval.n_problems`` held-out problems).

Writes ``results.json`` and ``vs_trl.png`` under ``--out`` and logs them, with one nested MLflow
run per run, to the config's tracking store (``{fileroot}/mlflow.db``, experiment
``benchmarks``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
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

from core.config import Config, ConfigError, ConfigSource
from core.runtime.stages import data_seed, evaluate_model, prepare_data
from experiments.benchmarks._common import (
    bench_source,
    mean_se,
    plus_minus,
    save_results,
    warm_start,
)
from experiments.benchmarks.async_vs_sync import TaskSpec, run_setting
from tasks.mlflow_tracking import start_run

CONFIG = "experiments/quickstart.yaml"
REPO = Path(__file__).resolve().parents[2]

MATCHED = {
    "model": "one SFT warm start (HF folder), float32, no gradient checkpointing",
    "data": "the same prepared train problems, prompts rendered by the same Prompter",
    "reward": "rollout.reward_fn on the completion text",
    "batch": "rollout.batch_size prompts × algorithm.group_size samples per optimizer step",
    "sampling": "temperature sampling.temperature, top-p 1, top-k off, sampling.max_new_tokens",
    "advantage": "GRPO, (reward − group mean) / group std",
    "loss": "token mean over the step's batch (TRL loss_type=dapo), clip ε = algorithm.eps_clip",
    "kl": "β = 0: no KL term, no reference model",
    "updates": "one gradient step per batch (TRL num_iterations=1, steps_per_generation=1)",
    "optimizer": "AdamW β (0.9, 0.999), ε 1e-8, constant algorithm.lr, no warm-up, weight "
    "decay 0, gradient-norm clip algorithm.max_grad_norm",
    "threads": "TRL: --trl-threads torch threads in one process; asyncrl sync: the same; "
    "asyncrl async: one thread per process (rollout and learner)",
}


def check_matchable(cfg: Config) -> None:
    """Refuse an algorithm TRL's GRPOTrainer would not run the same way, naming the field."""
    a = cfg.algorithm
    wanted = {
        "adv_estimator": "grpo",
        "normalize_std": True,
        "loss_aggregation": "token-mean",
        "kl_coef": 0.0,
        "kl_in_reward_coef": 0.0,
        "use_critic": False,
        "ppo_n_minibatches": 1,
        "dynamic_sampling": False,
        "overlong_reward_penalty": False,
        "importance_level": "token",
    }
    for name, value in wanted.items():
        if getattr(a, name) != value:
            raise ConfigError(
                f"algorithm.{name}={getattr(a, name)!r}: the TRL comparison needs {value!r} "
                "(TRL's GRPOTrainer is run with the matching setting)"
            )


def trl_spec(cfg: Config, model_dir: str, train_url: str, out: Path, seed: int, threads: int):
    """What ``_trl_grpo`` runs with, from the same config the asyncrl runs resolve."""
    return {
        "model": model_dir,
        "train": train_url,
        "out": str(out),
        "template": cfg.data.template,
        "reward_fn": cfg.rollout.reward_fn,
        "steps": cfg.learner.total_steps,
        "prompts_per_step": cfg.rollout.batch_size,
        "group_size": cfg.algorithm.group_size,
        "max_new_tokens": cfg.sampling.max_new_tokens,
        "temperature": cfg.sampling.temperature,
        "lr": cfg.algorithm.lr,
        "weight_decay": cfg.algorithm.weight_decay,
        "max_grad_norm": cfg.algorithm.max_grad_norm,
        "eps_clip": cfg.algorithm.eps_clip,
        "seed": seed,
        "threads": threads,
    }


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=2))
    log = out / "trl.log"
    with log.open("w") as f:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "experiments.benchmarks._trl_grpo",
                "--spec",
                str(out / "spec.json"),
            ],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"the TRL run failed (exit {proc.returncode}); {log}:\n{tail}")
    return json.loads((out / "result.json").read_text())


# ------------------------------------------------------------------------------ runs
def run_one(
    system: str,
    repeat: int,
    args: argparse.Namespace,
    source: ConfigSource,
    model_dir: str,
    train_url: str,
    parent_id: str,
) -> dict[str, Any]:
    seed = repeat
    if system == "trl":
        cfg = source.resolve({"experiment.seed": seed})
        spec = trl_spec(
            cfg, model_dir, train_url, args.out / f"trl-r{repeat}", seed, args.trl_threads
        )
        with start_run(
            cfg,
            run_name=f"vs-trl/trl-r{repeat}",
            parent_run_id=parent_id,
            tags={"kind": "benchmark"},
        ) as run:
            result = run_trl(spec)
            mlflow.log_metrics(
                {"bench/samples_per_s": result["samples_per_s"], "bench/step_s": result["step_s"]}
            )
        return {
            "system": "trl",
            "repeat": repeat,
            "seed": seed,
            "samples_per_s": result["samples_per_s"],
            "step_s_mean": result["step_s"] / max(result["steps"], 1),
            "final_model_dir": result["model_dir"],
            "in_run_accuracy": None,
            "mlflow_run_id": run.info.run_id,
        }
    eta, threads = (0, args.trl_threads) if system == "asyncrl-sync" else (args.eta, 1)
    adaptive = system == "asyncrl-adaptive"
    task = TaskSpec(CONFIG, args.steps, 0, target=1.0)
    row = run_setting(
        task,
        source,
        model_dir,
        eta,
        threads,
        parent_id,
        "vs-trl",
        extra={
            "experiment.seed": seed,
            "data.seed": args.data_seed,
            "rollout.adaptive_staleness": adaptive,
        },
        label=f"r{repeat}" + ("-adaptive" if adaptive else ""),
    )
    return {
        "system": system,
        "repeat": repeat,
        "seed": seed,
        "samples_per_s": row["samples_per_s"],
        "step_s_mean": row["step_s"],
        "final_model_dir": row["final_model_dir"],
        "in_run_accuracy": row["accuracy_final"],
        "learner_busy_fraction": row["learner_busy_fraction"],
        "mean_staleness": row["mean_staleness"],
        "final_window": row["final_window"],
        "mlflow_run_id": row["mlflow_run_id"],
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± SE per system over the repeats, and ratios to TRL's means."""
    entries = []
    for system in dict.fromkeys(r["system"] for r in rows):
        runs = [r for r in rows if r["system"] == system]
        entry: dict[str, Any] = {"system": system, "repeats": len(runs)}
        for key in ("samples_per_s", "accuracy", "step_s_mean"):
            entry[key], entry[f"{key}_se"] = mean_se([r[key] for r in runs])
        entries.append(entry)
    trl = next((e for e in entries if e["system"] == "trl"), None)
    for entry in entries:
        entry["speedup_vs_trl"] = entry["samples_per_s"] / trl["samples_per_s"] if trl else None
        entry["accuracy_gap_vs_trl"] = entry["accuracy"] - trl["accuracy"] if trl else None
    return entries


# ------------------------------------------------------------------------------ output
def print_table(entries: list[dict[str, Any]], steps: int, n_eval: int) -> None:
    table = Table(
        title=f"GRPO, {steps} steps per run: mean ± SE over repeats; accuracy on {n_eval} held-out problems, greedy"
    )
    for col in ("system", "repeats", "samples/s", "× TRL", "s/step", "accuracy", "gap vs TRL"):
        table.add_column(col, justify="right")
    for e in entries:
        table.add_row(
            e["system"],
            str(e["repeats"]),
            plus_minus(e["samples_per_s"], e["samples_per_s_se"], ".1f"),
            "—" if e["speedup_vs_trl"] is None else f"{e['speedup_vs_trl']:.2f}",
            plus_minus(e["step_s_mean"], e["step_s_mean_se"], ".2f"),
            plus_minus(e["accuracy"], e["accuracy_se"], ".3f"),
            "—" if e["accuracy_gap_vs_trl"] is None else f"{e['accuracy_gap_vs_trl']:+.3f}",
        )
    Console(width=150).print(table)


def plot(entries: list[dict[str, Any]], path: Path) -> Path:
    fig = Figure(figsize=(10, 4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    speed, acc = fig.subplots(1, 2)
    labels = {"trl": "TRL", "asyncrl-sync": "sync", "asyncrl-async": "η fixed",
              "asyncrl-adaptive": "η adaptive"}  # fmt: skip
    names = [labels.get(e["system"], e["system"]) for e in entries]
    colors = [f"C{i}" for i in range(len(entries))]
    speed.bar(
        names,
        [e["samples_per_s"] for e in entries],
        yerr=[e["samples_per_s_se"] or 0 for e in entries],
        color=colors,
        capsize=4,
    )
    acc.bar(
        names,
        [e["accuracy"] for e in entries],
        yerr=[e["accuracy_se"] or 0 for e in entries],
        color=colors,
        capsize=4,
    )
    speed.set(ylabel="trained samples/s", title="throughput (asyncrl: sync, async)")
    acc.set(ylabel="held-out accuracy (greedy)", title="accuracy after the same steps")
    for ax in (speed, acc):
        ax.grid(alpha=0.3, axis="y")
    fig.savefig(path)
    return path


# ------------------------------------------------------------------------------ main
# asyncrl-async runs at a fixed η = --eta; asyncrl-adaptive under the adaptive window ≤ --eta
# (rollout.adaptive_staleness, the quickstart's setting).
SYSTEMS = ("trl", "asyncrl-sync", "asyncrl-async", "asyncrl-adaptive")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="runs per system (seeds 1..N)")
    p.add_argument("--steps", type=int, default=40, help="GRPO steps per run")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"from {list(SYSTEMS)}")
    p.add_argument("--eta", type=int, default=4, help="the async systems' staleness bound")
    p.add_argument("--trl-threads", type=int, default=2, help="torch threads of TRL and sync")
    p.add_argument("--model", default=None, help="a warm-started HF folder (skips the SFT)")
    p.add_argument("--fileroot", default="runs", help="cluster.fileroot of the runs (MLflow too)")
    p.add_argument("--out", default="runs/benchmarks/vs_trl", help="JSON, plot, TRL outputs")
    p.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        p.error(f"--systems: unknown {unknown}; choose from {list(SYSTEMS)}")
    if args.repeats < 1 or args.steps < 1 or args.eta < 1:
        p.error("--repeats, --steps and --eta must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if "trl" in args.systems and importlib.util.find_spec("trl") is None:
        raise SystemExit("vs_trl needs TRL: pip install -e '.[trl]' (trl==1.16.0)")
    head = [
        f"learner.total_steps={args.steps}",
        "eval.every_n_steps=0",
        "algorithm.weight_decay=0.0",
        "rollout.adaptive_staleness=false",  # set per system (run_one)
    ]
    source = bench_source(CONFIG, head, args)
    cfg = source.resolve()
    check_matchable(cfg)  # before any work
    args.data_seed = data_seed(cfg)
    args.out = Path(args.out).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with start_run(cfg, run_name=f"vs-trl-{stamp}", tags={"kind": "benchmark"}) as parent:
        model_dir = args.model or warm_start(
            source.resolve({"experiment.trial": "bench-data"}), "math"
        )
        data = prepare_data(cfg)
        rows = []
        for repeat in range(1, args.repeats + 1):
            shift = (repeat - 1) % len(args.systems)
            for system in args.systems[shift:] + args.systems[:shift]:
                row = run_one(
                    system, repeat, args, source, model_dir, data.train_url, parent.info.run_id
                )
                rows.append(row)
                print(f"[r{repeat}] {system}: {row['samples_per_s']:.1f} samples/s", flush=True)
        for row in rows:  # one evaluation for every final model
            result = evaluate_model(cfg, row["final_model_dir"], data.test)
            row["accuracy"], row["accuracy_stderr"] = result.accuracy, result.stderr
            mlflow.MlflowClient().log_metric(
                row["mlflow_run_id"], "bench/accuracy", result.accuracy
            )
        entries = summarize(rows)
        n_eval = min(cfg.eval.n_problems or len(data.test), len(data.test))
        payload = {
            "config": CONFIG,
            "model": model_dir,
            "steps": args.steps,
            "n_eval": n_eval,
            "matched": MATCHED,
            "summary": entries,
            "runs": rows,
            "mlflow_run_id": parent.info.run_id,
        }
        save_results(
            args.out, payload, [plot(entries, args.out / "vs_trl.png")], parent.info.run_id
        )
        mlflow.log_metrics(
            {
                f"{e['system']}/speedup_vs_trl": e["speedup_vs_trl"]
                for e in entries
                if e["speedup_vs_trl"]
            }
        )
    print_table(entries, args.steps, n_eval)
    print(f"results: {args.out} · MLflow run {parent.info.run_id}")


if __name__ == "__main__":
    main()
