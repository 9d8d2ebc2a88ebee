"""Staleness vs accuracy: the math task's RL at η = 0 … 8 over seeds, with the statistics of
the decoupled objective that say where accuracy goes, and variants that try to win it back.

    python experiments/benchmarks/eta_accuracy.py              # η ∈ {0,1,2,4,8} × seeds 1,2,3
    asyncrl bench eta_accuracy --etas 0,4 --seeds 1,2 --variant nocap:algorithm.behaviour_cap=null

Every run starts RL from one SFT warm start of ``experiments/quickstart.yaml`` (or ``--model``)
through the bare core loop, like ``async_vs_sync``; ``experiment.seed`` varies the RL data
order and sampling over the same problems (``data.seed`` stays the warm start's). A variant
``NAME:KEY=VALUE[,KEY=VALUE…]`` reruns the whole grid with those overrides (``base`` is the
config as given); every variant's config is validated before any work starts.

Reported per variant and η, as mean ± standard error over the seeds: held-out accuracy after the
same number of RL steps and its gap to the same variant's sync runs (with the gap's SE), RL
seconds to ``--target`` accuracy (eval pauses excluded; over the seeds that reached it),
trained samples/s, and, averaged over steps: staleness per generated token, the share of
trajectories interrupted by a weight update, the share of tokens whose behaviour weight
π_prox/π_behav was above the cap (dropped in ``mask`` mode), the largest behaviour weight, the
clip fraction and the k3 KL(π_prox‖π_θ).

Writes ``results.json`` and ``eta_accuracy.png`` under ``--out`` and logs them, with one nested
MLflow run per (variant, η, seed), to the task config's tracking store (``{fileroot}/mlflow.db``,
experiment ``benchmarks``).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from core.config import ConfigError, ConfigSource, parse_overrides
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

CONFIG = "experiments/quickstart.yaml"

# (diagnostics key, table column, format): means over steps, then over seeds.
DIAGNOSTICS = (
    ("staleness/token_mean", "token staleness", ".2f"),
    ("staleness/interrupted_frac", "interrupted", ".2f"),
    ("actor/behav_masked_frac", "w > cap", ".4f"),
    ("actor/behav_weight_max", "max w", ".2f"),
    ("actor/behav_ess", "ESS", ".4f"),
    ("actor/clip_frac", "clip frac", ".4f"),
    ("actor/approx_kl", "KL(prox‖θ)", ".5f"),
)


@dataclass(frozen=True)
class Variant:
    """A named set of config overrides the whole η × seed grid is run with."""

    name: str
    text: str = ""  # the overrides as given, ``KEY=VALUE,…``
    overrides: dict[str, Any] = field(default_factory=dict)  # nested, YAML-typed

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``NAME:KEY=VALUE[,KEY=VALUE…]``; values are read as on the command line."""
        name, sep, body = text.partition(":")
        items = [item for item in body.split(",") if item]
        if not name or not sep or not items:
            raise ValueError(f"--variant: {text!r} is not NAME:KEY=VALUE[,KEY=VALUE...]")
        if name == "base":
            raise ValueError("--variant: 'base' is the config as given; pick another name")
        try:
            return cls(name, body, parse_overrides(items))
        except ConfigError as e:
            raise ValueError(f"--variant {name}: {e}") from None

    def apply(self, source: ConfigSource) -> ConfigSource:
        """``source`` with this variant's overrides on top (their keys checked here)."""
        return (
            source.with_values(self.overrides, f"variant {self.name}") if self.overrides else source
        )


def run_grid(
    args: argparse.Namespace,
    task: TaskSpec,
    source: ConfigSource,
    model_dir: str,
    parent_id: str,
    problems_seed: int,
) -> list[dict[str, Any]]:
    """Every (variant, η, threads, seed) run; the seeds vary RL sampling and data order over
    the same problems (``data.seed`` pinned to the warm start's)."""
    rows = []
    for variant in args.variants:
        variant_source = variant.apply(source)
        for eta in args.etas:
            if eta == 0 and args.shared_sync and variant.name != "base":
                continue  # compared with base's sync runs (share_sync)
            for threads in args.sync_threads if eta == 0 else [1]:
                for seed in args.seeds:
                    row = run_setting(
                        task,
                        variant_source,
                        model_dir,
                        eta,
                        threads,
                        parent_id,
                        "math",
                        extra={"experiment.seed": seed, "data.seed": problems_seed},
                        label=f"{variant.name}-seed{seed}",
                    )
                    row |= {"variant": variant.name, "seed": seed}
                    rows.append(row)
                    print(
                        f"[{variant.name}] {row['trial']}: {row['samples_per_s']:.1f} samples/s, "
                        f"accuracy {row['accuracy_start']:.3f} → {row['accuracy_final']:.3f}, "
                        f"w > cap {row['diagnostics'].get('actor/behav_masked_frac', 0):.4f}, "
                        f"final window {row['final_window']}",
                        flush=True,
                    )
    return share_sync(rows, args.variants) if args.shared_sync else rows


def share_sync(rows: list[dict[str, Any]], variants: list[Variant]) -> list[dict[str, Any]]:
    """``rows`` plus base's η = 0 runs as every other variant's sync runs (``--shared-sync``),
    marked ``shared_from: "base"``."""
    sync = [r for r in rows if r["variant"] == "base" and r["eta"] == 0]
    shared = [
        dict(r, variant=v.name, shared_from="base")
        for v in variants
        if v.name != "base"
        for r in sync
    ]
    return rows + shared


# ------------------------------------------------------------------------------ output
def print_table(entries: list[dict[str, Any]], target: float) -> None:
    steps = entries[0]["steps"] if entries else 0
    table = Table(title=f"math, {steps} RL steps per run: mean ± SE over seeds")
    columns = [
        "variant",
        "setting",
        "seeds",
        f"accuracy after {steps} steps",
        "gap vs sync",
        f"RL s to {target:.2f} (hits)",
        "samples/s",
        *(column for _, column, _ in DIAGNOSTICS),
    ]
    for column in columns:
        table.add_column(column, justify="right")
    for e in entries:
        gap = e["accuracy_gap_vs_sync"]
        gap_text = (
            "—"
            if e["eta"] == 0
            else f"{gap:+.3f}"
            + (f" ± {e['accuracy_gap_se']:.3f}" if e["accuracy_gap_se"] is not None else "")
        )
        ttt = plus_minus(e["time_to_target_s"], e["time_to_target_s_se"], ".0f")
        diags = [
            plus_minus(*e["diagnostics"].get(key, (None, None)), fmt) for key, _, fmt in DIAGNOSTICS
        ]
        table.add_row(
            e["variant"],
            e["setting"],
            str(len(e["seeds"])),
            plus_minus(e["accuracy_final"], e["accuracy_final_se"], ".3f"),
            gap_text,
            f"{ttt} ({e['target_hits']}/{len(e['seeds'])})",
            plus_minus(e["samples_per_s"], e["samples_per_s_se"], ".1f"),
            *diags,
        )
    Console(width=220).print(table)


def plot(entries: list[dict[str, Any]], path: Path) -> Path:
    """Accuracy at equal steps, RL seconds to the target and the share of tokens above the
    behaviour cap, each vs η, one line per variant; error bars are standard errors."""
    fig = Figure(figsize=(15, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    acc, ttt, capped = fig.subplots(1, 3)
    for i, name in enumerate(dict.fromkeys(e["variant"] for e in entries)):
        best = best_per_eta([e for e in entries if e["variant"] == name])
        etas = list(best)
        style = {"marker": "o", "capsize": 3, "color": f"C{i}", "label": name}
        acc.errorbar(
            etas,
            [best[x]["accuracy_final"] for x in etas],
            yerr=[best[x]["accuracy_final_se"] or 0 for x in etas],
            **style,
        )
        reached = [x for x in etas if best[x]["time_to_target_s"] is not None]
        ttt.errorbar(
            reached,
            [best[x]["time_to_target_s"] for x in reached],
            yerr=[best[x]["time_to_target_s_se"] or 0 for x in reached],
            **style,
        )
        masked = [best[x]["diagnostics"].get("actor/behav_masked_frac", (0.0, None)) for x in etas]
        capped.errorbar(etas, [m for m, _ in masked], yerr=[s or 0 for _, s in masked], **style)
    acc.set(xlabel="staleness bound η", ylabel="held-out accuracy", title="accuracy at equal steps")
    ttt.set(xlabel="staleness bound η", ylabel="RL seconds", title="time to target accuracy")
    capped.set(
        xlabel="staleness bound η",
        ylabel="share of tokens",
        title="behaviour weight above the cap",
    )
    for ax in (acc, ttt, capped):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.savefig(path)
    return path


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = seed_grid_parser(__doc__, "runs/benchmarks/eta_accuracy", sync_threads="2")
    p.add_argument("--steps", type=int, default=20, help="RL steps per run")
    p.add_argument("--eval-every", type=int, default=5, help="held-out eval every N steps")
    p.add_argument("--target", type=float, default=0.5, help="the time-to-accuracy target")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="also run the grid with these overrides (repeatable)",
    )
    p.add_argument("--no-base", action="store_true", help="run only the --variant grids")
    p.add_argument(
        "--shared-sync",
        action="store_true",
        help="run η = 0 with the config as given only, and compare every variant with those "
        "runs (for variants that change only off-policy corrections: at η = 0 their weights "
        "are 1 up to the train/inference mismatch)",
    )

    def variants(args: argparse.Namespace) -> None:
        base = [] if args.no_base else [Variant("base")]
        args.variants = base + [Variant.parse(v) for v in args.variant]
        if not args.variants:
            raise ValueError("--no-base needs at least one --variant")
        if args.shared_sync and (args.no_base or 0 not in args.etas):
            raise ValueError("--shared-sync needs the base grid with η = 0 (no --no-base)")
        if len({v.name for v in args.variants}) < len(args.variants):
            raise ValueError("--variant names must be distinct")

    return parse_seed_grid(p, argv, variants)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    head = [
        f"learner.total_steps={args.steps}",
        f"eval.every_n_steps={args.eval_every}",
        "rollout.adaptive_staleness=false",  # η is the setting under test; a variant may turn it on
    ]
    source = bench_source(CONFIG, head, args)
    # Every variant's config validates before any work starts.
    for variant in args.variants:
        cfg = variant.apply(source).resolve()
    if cfg.learner.total_steps < 1:
        raise SystemExit("learner.total_steps must be >= 1: the benchmark measures RL steps")
    task = TaskSpec(CONFIG, cfg.learner.total_steps, cfg.eval.every_n_steps, args.target)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with start_run(cfg, run_name=f"eta-accuracy-{stamp}", tags={"kind": "benchmark"}) as parent:
        model_dir = args.model or warm_start(
            source.resolve({"experiment.trial": "bench-data"}), "math"
        )
        problems = data_seed(source.resolve())  # the warm start's; a variant cannot move it
        rows = run_grid(args, task, source, model_dir, parent.info.run_id, problems)
        entries = aggregate_seeds(rows, by="variant")
        payload = {
            "config": CONFIG,
            "model": model_dir,
            "target_accuracy": args.target,
            "variants": {v.name: v.text for v in args.variants},
            "summary": entries,
            "runs": rows,
            "mlflow_run_id": parent.info.run_id,
        }
        save_results(out, payload, [plot(entries, out / "eta_accuracy.png")], parent.info.run_id)
        mlflow.log_metrics(
            {
                f"{e['variant']}/{e['setting']}/{name}": value
                for e in entries
                for name, value in (
                    ("accuracy", e["accuracy_final"]),
                    ("accuracy_gap_vs_sync", e["accuracy_gap_vs_sync"]),
                    ("speedup_vs_best_sync", e["speedup_vs_best_sync"]),
                )
            }
        )
    print_table(entries, args.target)
    print(f"results: {out} · MLflow run {parent.info.run_id}")


if __name__ == "__main__":
    main()
