"""Learner tokens/s with right-padded micro-batches vs packed sequences vs shared prompts.

Rows like the quickstart's (groups of ``--group-size`` samples of one prompt of
``--prompt-len`` tokens ± 20 %, each with a response of 1 to ``--max-response`` tokens) go
through the learner's forward and backward pass (log-probs, a summed loss) in micro-batches of
``--micro-batch-tokens``, either padded (each micro-batch as wide as its longest row), packed
(rows end to end in rows of that width, see ``core/training/packing.py``) or with shared
prompts (each distinct prompt once, the samples attending to its cache, see
``core/training/shared_prompts.py``). Reported: real tokens per second of forward+backward and
the positions the model computes, for each model size.

    python experiments/benchmarks/learner_packing.py --presets tiny,small --out runs/bench

Writes ``learner_packing.json`` and ``learner_packing.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2ForCausalLM

from core.models.builder import preset_config
from core.training.batch import TrainBatch, micro_batches
from core.training.logprobs import logprobs_from_logits
from core.training.packing import pack_rows, unpack
from core.training.shared_prompts import (
    logprobs_from_rows,
    share_prompts,
    shared_logits,
    shared_micro_batch_indices,
)

logger = logging.getLogger("learner_packing")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny,small", help="comma-separated model presets")
    p.add_argument("--rows", type=int, default=128, help="rows per step (prompts x group size)")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt (1: no sharing)")
    p.add_argument("--prompt-len", type=int, default=60)
    p.add_argument("--max-response", type=int, default=64)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument(
        "--widths",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[1.0, 2.0],
        help="packed row widths, as multiples of the micro-batch's longest row",
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="timed steps per layout (after 1 warm-up)"
    )
    p.add_argument("--torch-threads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=400)
    p.add_argument("--out", default="runs/benchmarks/learner_packing")
    return p.parse_args()


def make_batch(args: argparse.Namespace, seed: int = 0) -> TrainBatch:
    gen = torch.Generator().manual_seed(seed)
    group = torch.arange(args.rows) // args.group_size  # row -> its prompt
    n_prompts = int(group[-1]) + 1
    prompt = torch.randint(int(args.prompt_len * 0.8), int(args.prompt_len * 1.2) + 1,
                           (n_prompts,), generator=gen)[group]  # fmt: skip
    response = torch.randint(1, args.max_response + 1, (args.rows,), generator=gen)
    lengths = (prompt + response).tolist()
    width = max(lengths)
    ids = torch.randint(1, args.vocab_size, (args.rows, width), generator=gen)
    prompt_ids = torch.randint(1, args.vocab_size, (n_prompts, width), generator=gen)[group]
    ids = torch.where(torch.arange(width)[None, :] < prompt[:, None], prompt_ids, ids)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    loss_mask = (torch.arange(width)[None, :] >= prompt[:, None]).float() * mask
    zeros = torch.zeros((args.rows, width))
    return TrainBatch(input_ids=ids * mask, attention_mask=mask, loss_mask=loss_mask,
                      behaviour_logprobs=zeros, versions=mask - 1, rewards=zeros[:, 0],
                      prompt_lens=prompt)  # fmt: skip


def shared_micro_batches(batch: TrainBatch, max_tokens: int) -> list[TrainBatch]:
    """The learner's micro-batches when it shares prompts (groups kept together)."""
    return [batch.select(rows).trim() for rows in shared_micro_batch_indices(batch, max_tokens)]


def step(model: torch.nn.Module, micros: list[TrainBatch], widen: float | str) -> tuple[float, int]:
    """One forward+backward over ``micros`` (packed into rows ``widen`` times as wide as the
    longest when ``widen > 0``, ``"shared"`` for shared prompts); returns seconds and the
    positions computed."""
    start, positions = time.perf_counter(), 0
    for micro in micros:
        ids, mask = micro.input_ids, micro.attention_mask
        if widen == "shared":
            shared = share_prompts(ids, mask, micro.prompt_lens)
            logprobs, _ = logprobs_from_rows(shared_logits(model, shared), shared.source, ids, mask)
            positions += shared.prompt_ids.numel() + shared.suffix_ids.numel()
        else:
            if widen:
                layout = pack_rows(ids, mask, width=int(widen * micro.width))
                logits = unpack(model(input_ids=layout.input_ids, position_ids=layout.position_ids,
                                      use_cache=False).logits, layout)  # fmt: skip
                positions += layout.input_ids.numel()
            else:
                logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                positions += ids.numel()
            logprobs = logprobs_from_logits(logits, ids, mask)
        (-(logprobs * micro.loss_mask).sum()).backward()
    return time.perf_counter() - start, positions


def measure(preset: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(preset_config(preset, vocab_size=args.vocab_size, pad_token_id=0))
    batch = make_batch(args)
    padded_micros = micro_batches(batch, args.micro_batch_tokens)
    shared_micros = shared_micro_batches(batch, args.micro_batch_tokens)
    rows = []
    for widen in [0.0, *args.widths, "shared"]:
        micros = shared_micros if widen == "shared" else padded_micros
        layout = (
            "shared prompts" if widen == "shared" else f"packed {widen:g}x" if widen else "padded"
        )
        step(model, micros, widen)  # warm-up
        times = []
        for _ in range(args.repeats):
            model.zero_grad(set_to_none=True)
            seconds, positions = step(model, micros, widen)
            times.append(seconds)
        median = statistics.median(times)
        rows.append({
            "preset": preset, "layout": layout, "seconds": median,
            "tokens_per_s": batch.n_tokens / median, "positions": positions,
            "micro_batches": len(micros),
            "times": times,
        })  # fmt: skip
        logger.info("%s %s: %.0f tokens/s", preset, layout, batch.n_tokens / median)
    for row in rows[1:]:
        row["speedup"] = rows[0]["seconds"] / row["seconds"]
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Learner forward+backward: padded vs packed vs shared prompts")
    columns = [("model", "preset", "{}"), ("layout", "layout", "{}"),
               ("s/step (median)", "seconds", "{:.3f}"), ("tokens/s", "tokens_per_s", "{:,.0f}"),
               ("positions", "positions", "{:,}"), ("micro-batches", "micro_batches", "{}"),
               ("speed-up", "speedup", "{:.2f}x")]  # fmt: skip
    for name, *_ in columns:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(fmt.format(row[key]) if key in row else "-" for _, key, fmt in columns))
    Console(width=120).print(table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r["preset"] for r in rows))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    width = 0.8 / len(layouts)
    for k, layout in enumerate(layouts):
        values = [next(r["tokens_per_s"] for r in rows if r["preset"] == p and r["layout"] == layout)
                  for p in presets]  # fmt: skip
        offset = (k - (len(layouts) - 1) / 2) * width
        ax.bar([i + offset for i in range(len(presets))], values, width, label=layout)
    ax.set_xticks(range(len(presets)), presets)
    ax.set_ylabel("real tokens / s (forward + backward)")
    ax.set_title("Learner throughput: padded, packed, shared prompts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.torch_threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for preset in args.presets.split(",") for row in measure(preset, args)]
    print_table(rows)
    meta = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "machine": platform.platform(), "args": vars(args)}  # fmt: skip
    (out / "learner_packing.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    plot(rows, out / "learner_packing.png")
    logger.info("wrote %s", out / "learner_packing.json")


if __name__ == "__main__":
    main()
