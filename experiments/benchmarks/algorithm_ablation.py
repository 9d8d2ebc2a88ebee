"""GRPO vs PPO vs DAPO from one warm start: held-out accuracy curves per algorithm.

    python experiments/benchmarks/algorithm_ablation.py [--algorithms grpo,ppo,dapo] [--seeds 1]

Trains the config's SFT warm start once (or takes ``--model DIR``), then runs the ``ablation``
Prefect flow (``asyncrl ablate``) with every algorithm starting RL from that model: one MLflow
parent run with a child run per algorithm × seed, a comparison table and the curves figure.
Evaluates every ``--eval-every`` steps so the curves have points. Copies ``curves.png`` and the
table to ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from core.config import parse_config
from experiments.benchmarks._common import warm_start
from flows.ablation import ablation, ablation_variants
from tasks.comparison_report import render_markdown


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/quickstart.yaml")
    p.add_argument("--algorithms", default="grpo,ppo,dapo")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--model", default=None, help="a warm-started HF folder (skips SFT)")
    p.add_argument("--out", default="runs/benchmarks/algorithm_ablation")
    p.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    args = p.parse_args(argv)
    algorithms = [a for a in args.algorithms.split(",") if a]
    source = parse_config(args.config, [f"eval.every_n_steps={args.eval_every}", *args.overrides])
    ablation_variants(source, algorithms, args.seeds)  # every variant validates before any work
    model = args.model
    if model is None:
        model = warm_start(source.resolve({"experiment.trial": "ablation-warm-start"}), "ablation")
    from_model = source.with_values({"model.path": model, "sft.enabled": False}, "warm start")

    started = time.perf_counter()
    result = ablation(from_model, algorithms, args.seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(result["plot"], out / "curves.png")
    table = render_markdown(result["table"])
    (out / "comparison.md").write_text(table)
    print(table)
    print(
        f"{len(result['runs'])} runs in {time.perf_counter() - started:.0f} s · figure "
        f"{out / 'curves.png'} · MLflow parent run {result['mlflow_parent_run_id']}"
    )


if __name__ == "__main__":
    main()
