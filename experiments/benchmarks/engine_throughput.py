"""Generation throughput of the in-process HF engine at several client concurrencies.

At each concurrency ``c``, ``c`` clients each submit requests in a loop (a new one as soon as the
previous returns) for ``--duration-s`` seconds; we report generated tokens/s, requests/s, the
engine's batching (requests per round, live rows per decode step) and how much model time went
to (re-)prefill. Engine modes: ``splice`` keeps the KV cache of running rows when requests join
or leave, ``reprefill`` re-prefills them every round, ``noshare`` splices but prefills every
request of a group itself (no shared prefill), ``noprefix`` splices but keeps no finished
request's cache (every call of a conversation prefills it all). With ``--group-size G`` the
clients submit groups of ``G`` requests for one prompt at once, as GRPO's rollouts do (``c``
then counts requests: ``c / G`` clients). With ``--turns T`` each client holds conversations of
``T`` calls instead, as an agent does: each call's prompt is the last prompt, its output and
``--tool-tokens`` new tokens (a tool result). For context, ``HF generate`` on one static batch
of ``c`` prompts is measured too.

    python experiments/benchmarks/engine_throughput.py --concurrency 1,8,32,128 --out runs/bench
    python experiments/benchmarks/engine_throughput.py --group-size 8 --modes splice,noshare \
        --concurrency 8,32,128 --no-hf-baseline
    python experiments/benchmarks/engine_throughput.py --turns 8 --modes splice,noprefix \
        --concurrency 8,32,128 --no-hf-baseline

Without ``--model`` a tiny (~1M parameter) Qwen2 is built on the fly. Writes
``engine_throughput.json`` and ``engine_throughput.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from core.inference import GenerationRequest, HFEngine, SamplingParams
from core.inference.engine.hf_engine import DEFAULT_PREFIX_CACHE_TOKENS
from core.models import create_pretrained, load_model, load_tokenizer

logger = logging.getLogger("engine_throughput")

CORPUS = [
    f"Question: Finn has {a} beads and finds {b} more. How many now?\nAnswer: {a}+{b}={a + b}. #### {a + b}"
    for a in range(20)
    for b in range(20)
]
COUNTERS = ("requests_served", "tokens_generated", "batches", "rows", "decode_steps",
            "prefill_tokens", "reprefilled_tokens", "shared_prefill_tokens",
            "prefix_cached_tokens", "prefill_s", "decode_s")  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="HF model folder (default: build a tiny model)")
    p.add_argument("--concurrency", default="1,8,32,128", help="comma-separated client counts")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--duration-s", type=float, default=8.0, help="per concurrency level")
    p.add_argument("--max-batch-size", type=int, default=128)
    p.add_argument("--chunk-tokens", type=int, default=16)
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (1 avoids OpenMP stalls on a shared box)",
    )
    p.add_argument(
        "--modes",
        default="splice,reprefill",
        help="engine modes: 'splice' (KV cache kept across rounds, groups prefilled once, "
        "finished requests' caches kept for continuations), 'reprefill', 'noshare' (splice, but "
        "each request of a group prefilled itself) and/or 'noprefix' (splice, no caches kept)",
    )
    p.add_argument("--group-size", type=int, default=1, help="requests per prompt, sent together")
    p.add_argument("--turns", type=int, default=1, help="calls per conversation (group size 1)")
    p.add_argument("--tool-tokens", type=int, default=24, help="new tokens between two calls")
    p.add_argument("--no-hf-baseline", action="store_true", help="skip the HF generate baseline")
    p.add_argument("--out", default="runs/benchmarks/engine_throughput")
    return p.parse_args()


def make_prompts(tokenizer, n: int = 64) -> list[list[int]]:
    texts = [
        f"Question: Ada has {i} shells and finds {i % 7 + 2} more. How many?\nAnswer:"
        for i in range(n)
    ]
    return [tokenizer(t)["input_ids"] for t in texts]


async def run_level(
    engine: HFEngine,
    prompts: list[list[int]],
    concurrency: int,
    sampling: SamplingParams,
    duration_s: float,
    group_size: int = 1,
    turns: int = 1,
    tool_tokens: int = 24,
) -> dict[str, Any]:
    """``concurrency`` requests in flight for ``duration_s`` (closed-loop clients, each sending
    ``group_size`` requests of one prompt at once, or holding ``turns``-call conversations);
    returns throughput and latencies."""
    latencies: list[float] = []
    tokens = 0
    deadline = time.perf_counter() + duration_s
    n_clients = max(concurrency // group_size, 1)

    async def client(index: int) -> None:
        nonlocal tokens
        i = index
        while time.perf_counter() < deadline:
            prompt = prompts[i % len(prompts)]
            for turn in range(turns):
                start = time.perf_counter()
                request = GenerationRequest(prompt, sampling)
                group = await asyncio.gather(
                    *(engine.agenerate(request) for _ in range(group_size))
                )
                for resp in group:
                    latencies.append(time.perf_counter() - start)
                    tokens += len(resp.output_ids)
                tool = prompts[(i + turn + 1) % len(prompts)] * tool_tokens
                prompt = prompt + group[0].output_ids + tool[:tool_tokens]
            i += n_clients

    before = {k: getattr(engine.stats, k) for k in COUNTERS}
    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(n_clients)))
    elapsed = time.perf_counter() - start
    await engine.wait_idle()  # the last round's counts land when it ends, after its requests
    d = {k: getattr(engine.stats, k) - before[k] for k in COUNTERS}
    model_s = d["prefill_s"] + d["decode_s"]
    return {
        "concurrency": concurrency,
        "elapsed_s": elapsed,
        "requests": len(latencies),
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "requests_per_s": len(latencies) / elapsed,
        "latency_p50_s": statistics.median(latencies),
        "mean_batch_size": d["rows"] / max(d["batches"], 1),  # requests per round
        "mean_rows_per_step": d["tokens_generated"] / max(d["decode_steps"], 1),
        "rounds": d["batches"],
        "prefill_share": d["prefill_s"] / model_s if model_s else 0.0,
        "reprefilled_token_share": d["reprefilled_tokens"] / max(d["prefill_tokens"], 1),
        # of the prompt tokens the requests needed, the share taken from a group member's prefill
        "shared_prefill_share": d["shared_prefill_tokens"]
        / max(d["prefill_tokens"] + d["shared_prefill_tokens"], 1),
        # ... and the share taken from the finished request a call continues
        "prefix_cached_share": d["prefix_cached_tokens"]
        / max(d["prefill_tokens"] + d["shared_prefill_tokens"] + d["prefix_cached_tokens"], 1),
    }


def hf_generate_baseline(
    model, prompts, batch: int, sampling: SamplingParams, pad_id: int
) -> float:
    """Tokens/s of ``model.generate`` on one static, left-padded batch (no eos stop)."""
    chosen = [prompts[i % len(prompts)] for i in range(batch)]
    width = max(len(p) for p in chosen)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chosen])
    mask = (
        torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in chosen])[:, None]
    ).long()
    kwargs = dict(do_sample=True, temperature=sampling.temperature, top_k=0, top_p=1.0)
    with torch.inference_mode():
        model.generate(
            ids[:, :], attention_mask=mask, max_new_tokens=4, pad_token_id=pad_id, **kwargs
        )
        start = time.perf_counter()
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens, min_new_tokens=sampling.max_new_tokens,
            pad_token_id=pad_id, **kwargs,
        )  # fmt: skip
    elapsed = time.perf_counter() - start
    return (out.shape[1] - width) * batch / elapsed


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="HFEngine generation throughput")
    columns = [
        ("mode", "mode", "{}"),
        ("clients", "concurrency", "{}"),
        ("tok/s", "tokens_per_s", "{:,.0f}"),
        ("req/s", "requests_per_s", "{:.1f}"),
        ("p50 latency s", "latency_p50_s", "{:.2f}"),
        ("req/round", "mean_batch_size", "{:.1f}"),
        ("rows/step", "mean_rows_per_step", "{:.1f}"),
        ("prefill share", "prefill_share", "{:.0%}"),
        ("re-prefilled", "reprefilled_token_share", "{:.0%}"),
        ("prefill shared", "shared_prefill_share", "{:.0%}"),
        ("prefix cached", "prefix_cached_share", "{:.0%}"),
    ]
    for name, *_ in columns:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(fmt.format(row[key]) if key in row else "-" for _, key, fmt in columns))
    Console(width=120).print(table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {
        "splice": "HFEngine, KV cache spliced",
        "reprefill": "HFEngine, re-prefill per round",
        "noshare": "HFEngine, spliced, no shared prefill",
        "noprefix": "HFEngine, spliced, no prefix cache",
        "hf-generate": "HF generate, one static batch",
    }
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        style = "s--" if mode == "hf-generate" else "o-"
        ax.plot(
            [r["concurrency"] for r in mine],
            [r["tokens_per_s"] for r in mine],
            style,
            label=labels.get(mode, mode),
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("Generation throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    if args.turns > 1 and args.group_size > 1:
        raise SystemExit("--turns > 1 needs --group-size 1: conversations are one request a call")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.torch_threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or create_pretrained(
        "tiny", CORPUS, tempfile.mkdtemp(prefix="tiny-"), vocab_size=300, seed=0
    )
    tokenizer = load_tokenizer(model_dir)
    prompts = make_prompts(tokenizer)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    levels = [int(c) for c in args.concurrency.split(",")]
    rows: list[dict[str, Any]] = []
    for mode in args.modes.split(","):
        engine = HFEngine.from_pretrained(
            model_dir,
            max_batch_size=args.max_batch_size,
            chunk_tokens=args.chunk_tokens,
            seed=0,
            splice=mode != "reprefill",
            share_prefill=mode in ("splice", "noprefix"),
            prefix_cache_tokens=0 if mode == "noprefix" else DEFAULT_PREFIX_CACHE_TOKENS,
        )
        try:
            shape = (args.group_size, args.turns, args.tool_tokens)
            asyncio.run(run_level(engine, prompts, max(levels), sampling, 1.0, *shape))
            for c in levels:
                level = run_level(engine, prompts, c, sampling, args.duration_s, *shape)
                row = asyncio.run(level)
                logger.info("%s, concurrency %d: %.0f tokens/s", mode, c, row["tokens_per_s"])
                rows.append(
                    {"mode": mode, "group_size": args.group_size, "turns": args.turns, **row}
                )
        finally:
            engine.close()
    device = engine.device
    if not args.no_hf_baseline:
        model = load_model(model_dir).to(device)
        for c in levels:
            tps = hf_generate_baseline(model, prompts, c, sampling, tokenizer.pad_token_id)
            rows.append({"mode": "hf-generate", "concurrency": c, "tokens_per_s": tps})
    print_table(rows)
    meta = {
        "model": str(model_dir),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.platform(),
        "args": vars(args),
    }
    (out / "engine_throughput.json").write_text(
        json.dumps({"meta": meta, "results": rows}, indent=2)
    )
    plot(rows, out / "engine_throughput.png")
    logger.info("wrote %s and %s", out / "engine_throughput.json", out / "engine_throughput.png")


if __name__ == "__main__":
    main()
