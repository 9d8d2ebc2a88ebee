"""Async vs sync on the quickstart math task: the same RL run at several staleness bounds η.

    python experiments/benchmarks/async_vs_sync.py --etas 0,1,2,4,8 --steps 20

All settings start from one SFT warm-started model (trained once, or given with --model) and run
the same number of RL steps through the bare core loop. η = 0 is the synchronous baseline; it is
run with 1 and 2 torch threads per process (rollout and learner alternate, so sync may use both
cores in each phase) and the faster one is the reference. Reported per setting: trained samples/s
and tokens/s (over training steps), learner busy fraction, time split, final held-out accuracy,
time to reach --target accuracy, mean/max staleness. The ceiling of overlap is
(T_gen + T_train) / max(T_gen, T_train), measured from the sync run's own phases.

Prints a table and writes results.json and throughput_vs_eta.png under --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from core.config import load_config  # noqa: E402
from core.runtime.metrics import MemorySink  # noqa: E402
from core.runtime.sft import sft_warm_start  # noqa: E402
from core.runtime.stages import build_or_load_model, prepare_data  # noqa: E402
from core.runtime.trainer import Trainer  # noqa: E402

logger = logging.getLogger("bench")


def run_setting(config_path: str, base: list[str], model_dir: str, data: Any, eta: int, threads: int,
                steps: int, out: Path) -> dict[str, Any]:
    trial = f"eta{eta}-t{threads}"
    cfg = load_config(config_path, [*base, f"rollout.max_staleness={eta}", f"scheduler.torch_threads={threads}",
                                     f"actor.total_steps={steps}", f"cluster.fileroot={out}", f"experiment.trial={trial}",
                                     "checkpoint.every_n_steps=0", "sft.enabled=false"])
    sink = MemorySink()
    started = time.perf_counter()
    result = Trainer(cfg, model_dir, data.train, data.test, sink).run()
    s = result.summary
    steps_run = max(result.steps_run, 1)
    return {
        "setting": trial, "eta": eta, "threads": threads, "steps": result.steps_run,
        "samples_per_s": s["samples_per_s"], "tokens_per_s": s["tokens_per_s"],
        "learner_busy_fraction": s["learner_busy_fraction"],
        "gen_wait_s_per_step": s["wait_rollout_s"] / steps_run, "train_s_per_step": s["train_s"] / steps_run,
        "publish_s_per_step": s["publish_s"] / steps_run,
        "accuracy_start": result.evals[0]["accuracy"], "accuracy_final": result.evals[-1]["accuracy"],
        "evals": [{k: e[k] for k in ("version", "accuracy", "elapsed_s")} for e in result.evals],
        "mean_staleness": _mean_staleness(sink), "max_staleness": max((v for _, v in sink.series("staleness/max")), default=0),
        "wall_s": time.perf_counter() - started,
    }


def _mean_staleness(sink: MemorySink) -> float:
    values = [v for _, v in sink.series("staleness/mean")]
    return sum(values) / len(values) if values else 0.0


def time_to_target(row: dict[str, Any], target: float) -> float | None:
    hits = [e["elapsed_s"] for e in row["evals"] if e["accuracy"] >= target]
    return min(hits) if hits else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/quickstart.yaml")
    p.add_argument("--etas", default="0,1,2,4,8")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--target", type=float, default=0.45, help="held-out accuracy for time-to-target")
    p.add_argument("--model", default=None, help="warm-started HF folder; default: run SFT once")
    p.add_argument("--sync-threads", default="1,2", help="torch threads tried for the η=0 baseline")
    p.add_argument("--out", default="runs/benchmarks/async_vs_sync")
    p.add_argument("overrides", nargs="*", help="extra config overrides (key=value)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out).resolve()
    base = [*args.overrides, f"eval.every_n_steps={args.eval_every}"]

    cfg = load_config(args.config, [*base, f"cluster.fileroot={out}", "experiment.trial=data"])
    data = prepare_data(cfg)
    model_dir = args.model
    if model_dir is None:
        t = time.perf_counter()
        model_dir = str(sft_warm_start(cfg, build_or_load_model(cfg, data), data.train, MemorySink()))
        print(f"SFT warm start: {time.perf_counter() - t:.0f} s → {model_dir}")

    rows = []
    for eta in [int(e) for e in args.etas.split(",")]:
        for threads in ([int(t) for t in args.sync_threads.split(",")] if eta == 0 else [1]):
            row = run_setting(args.config, base, model_dir, data, eta, threads, args.steps, out)
            row["time_to_target_s"] = time_to_target(row, args.target)
            rows.append(row)
            print(f"{row['setting']}: {row['samples_per_s']:.1f} samples/s, busy {row['learner_busy_fraction']:.2f}, "
                  f"accuracy {row['accuracy_start']:.3f} → {row['accuracy_final']:.3f}")

    sync = max((r for r in rows if r["eta"] == 0), key=lambda r: r["samples_per_s"])
    t_gen, t_train = sync["gen_wait_s_per_step"], sync["train_s_per_step"] + sync["publish_s_per_step"]
    ceiling = (t_gen + t_train) / max(t_gen, t_train, 1e-9)
    for row in rows:
        row["speedup_vs_best_sync"] = row["samples_per_s"] / sync["samples_per_s"]
    report = {"rows": rows, "best_sync": sync["setting"], "ceiling": ceiling, "T_gen_s": t_gen, "T_train_s": t_train,
              "steps": args.steps, "target_accuracy": args.target, "model": model_dir}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    _plot(rows, out / "throughput_vs_eta.png")
    _print(report)


def _print(report: dict[str, Any]) -> None:
    table = Table(title=f"async vs sync, {report['steps']} RL steps (ceiling {report['ceiling']:.2f}×: "
                        f"T_gen {report['T_gen_s']:.2f} s, T_train {report['T_train_s']:.2f} s per step)")
    for col in ("setting", "samples/s", "tokens/s", "× best sync", "busy", "acc start → final",
                "t→target s", "staleness mean/max"):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        ttt = "—" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
        table.add_row(r["setting"], f"{r['samples_per_s']:.1f}", f"{r['tokens_per_s']:.0f}",
                      f"{r['speedup_vs_best_sync']:.2f}", f"{r['learner_busy_fraction']:.2f}",
                      f"{r['accuracy_start']:.3f} → {r['accuracy_final']:.3f}", ttt,
                      f"{r['mean_staleness']:.2f} / {r['max_staleness']:.0f}")
    Console().print(table)


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    best = {}
    for r in rows:
        if r["eta"] not in best or r["samples_per_s"] > best[r["eta"]]["samples_per_s"]:
            best[r["eta"]] = r
    etas = sorted(best)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(etas, [best[e]["samples_per_s"] for e in etas], marker="o")
    ax1.set_xlabel("staleness bound η")
    ax1.set_ylabel("trained samples / s")
    ax1.set_title("throughput vs η")
    ax2.plot(etas, [best[e]["accuracy_final"] for e in etas], marker="o", color="tab:green")
    ax2.set_xlabel("staleness bound η")
    ax2.set_ylabel("held-out accuracy after RL")
    ax2.set_title("accuracy vs η")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
