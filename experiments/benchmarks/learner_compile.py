"""Does ``torch.compile`` speed up the learner's step on CPU? Eager vs compiled, batch by batch.

Each of ``--batches`` fresh quickstart-shaped batches (``learner_packing.make_batch``: groups of
``--group-size`` samples, prompt ``--prompt-len`` ± 20 %, response 1 to ``--max-response``)
goes through one forward+backward with shared prompts, first eager, then through
``torch.compile(model, dynamic=True)``. Fresh batches matter: a real run's widths change every
step, and a compiled model that recompiles for a new shape pays its compile time again. Reported
per batch: eager and compiled seconds (compile time included where it happened).

    python experiments/benchmarks/learner_compile.py --batches 8   # minutes: each compile ~1 min

Writes ``learner_compile.json`` and ``learner_compile.png`` to ``--out``. Measured 2026-12-02
(docs/concepts/engine-and-learner.md, "Shared prompts in the learner"): 1.03-1.33x on the batches that reuse the compiled
graph, but the first batch compiles (32 s) and batch 5 recompiles (18 s, with inductor's cache
warm; 55 s cold) against ~1 s steps, so the learner does not compile.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from core.models.builder import preset_config
from experiments.benchmarks.learner_packing import make_batch, shared_micro_batches, step

logger = logging.getLogger("learner_compile")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batches", type=int, default=8, help="fresh batches (seeds 0..N-1)")
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=40)
    p.add_argument("--max-response", type=int, default=48)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--vocab-size", type=int, default=400)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", default="runs/benchmarks/learner_compile")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(preset_config(args.preset, vocab_size=args.vocab_size, pad_token_id=0))
    compiled = torch.compile(model, dynamic=True)
    rows = []
    for seed in range(args.batches):
        batch = make_batch(args, seed=seed)
        micros = shared_micro_batches(batch, args.micro_batch_tokens)
        times = {}
        for name, module in (("eager", model), ("compiled", compiled)):
            model.zero_grad(set_to_none=True)
            times[name] = step(module, micros, "shared")[0]
        rows.append({"batch": seed, "width": batch.width, **times})
        logger.info("batch %d (width %d): eager %.3f s, compiled %.3f s", seed, batch.width,
                    times["eager"], times["compiled"])  # fmt: skip
    print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "machine": platform.platform(), "args": vars(args)}  # fmt: skip
    (out / "learner_compile.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    plot(rows, out / "learner_compile.png")


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Learner step (shared prompts): eager vs torch.compile, fresh batches")
    for name in ("batch", "width", "eager s", "compiled s", "compiled / eager"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), str(r["width"]), f"{r['eager']:.3f}",
                      f"{r['compiled']:.3f}", f"{r['compiled'] / r['eager']:.2f}")  # fmt: skip
    Console(width=100).print(table)


def plot(rows: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for name in ("eager", "compiled"):
        ax.plot([r["batch"] for r in rows], [r[name] for r in rows], marker="o", label=name)
    ax.set(xlabel="batch (fresh shapes)", ylabel="seconds (log)", yscale="log",
           title="torch.compile: first compile and recompiles")  # fmt: skip
    ax.legend()
    fig.savefig(path)


if __name__ == "__main__":
    main()
