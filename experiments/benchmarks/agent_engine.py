"""The engine on real agent episodes: N search-agent episodes at once, with and without the
prefix cache.

Each episode is the search agent of ``experiments/agent_search.yaml`` (multi-turn, BM25 tools)
talking to one in-process ``HFEngine``; the tools answer at once (no latency), so the table is
the engine's own cost: episodes/s, generated tokens/s, how many prompt tokens were prefilled
and how many came from the prefix cache, and the engine's time split (prefill vs decode, ms per
decode step). Modes: ``prefix`` (the default engine) and ``noprefix`` (no finished request's
cache kept: every call prefills its whole conversation). Episodes are seeded, so every mode
samples the same episodes when the engine computes the same log-probs.

    python experiments/benchmarks/agent_engine.py --model runs/agent-search/sft/final \
        --episodes 32,128 data.search_synthetic.corpus_size=100

An untrained model (no ``--model``: the tiny preset, built on the fly) rarely calls a tool, so
give a warm-started one for agent-shaped episodes. Writes ``agent_engine.json`` and
``agent_engine.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from core.config import load_config
from core.inference import HFEngine
from core.inference.engine.hf_engine import DEFAULT_PREFIX_CACHE_TOKENS
from core.models import load_tokenizer
from core.rollout.api import episode_rows
from core.runtime.rollout_worker import build_workflow
from core.runtime.stages import build_or_load_model, prepare_data

logger = logging.getLogger("agent_engine")
CONFIG = "experiments/agent_search.yaml"
MODES = {"prefix": DEFAULT_PREFIX_CACHE_TOKENS, "noprefix": 0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default=None, help="HF folder (default: the config's model, untrained)"
    )
    p.add_argument("--episodes", default="32,128", help="episodes at once, comma-separated")
    p.add_argument("--modes", default="prefix,noprefix", help=f"engine modes: {list(MODES)}")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", default="runs/benchmarks/agent_engine")
    p.add_argument("overrides", nargs="*", help=f"overrides of {CONFIG} (key=value)")
    args = p.parse_args(argv)
    try:
        args.episodes = [int(n) for n in args.episodes.split(",")]
        args.modes = args.modes.split(",")
    except ValueError as e:
        p.error(str(e))
    if unknown := [m for m in args.modes if m not in MODES]:
        p.error(f"--modes: unknown {unknown}; expected some of {list(MODES)}")
    if min(args.episodes) < 1:
        p.error("--episodes must be >= 1")
    return args


async def run_episodes(engine: HFEngine, workflow: Any, samples: list[dict]) -> dict[str, Any]:
    before = engine.stats.as_dict()
    start = time.perf_counter()
    episodes = await asyncio.gather(*(workflow.run_episode(engine, s) for s in samples))
    wall = time.perf_counter() - start
    await engine.wait_idle()  # the last round's counts land when it ends, after its requests
    after = engine.stats.as_dict()
    spent = {k: after[k] - before[k] for k in ("tokens_generated", "decode_steps",
                                               "prefill_tokens", "prefix_cached_tokens",
                                               "prefill_s", "decode_s")}  # fmt: skip
    firsts = [rows[0] for rows in map(episode_rows, episodes) if rows]
    model_s = spent["prefill_s"] + spent["decode_s"]
    return {
        "episodes": len(samples),
        "wall_s": wall,
        "episodes_per_s": len(samples) / wall,
        "tokens_per_s": spent["tokens_generated"] / wall,
        "calls_per_episode": sum(t.metadata["turns"] for t in firsts) / len(samples),
        "mean_reward": sum(t.reward for t in firsts) / len(samples),  # a rejected one scores 0
        "prefill_share": spent["prefill_s"] / model_s if model_s else 0.0,
        "ms_per_decode_step": 1e3 * spent["decode_s"] / max(spent["decode_steps"], 1),
        **spent,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="HFEngine on search-agent episodes (no tool latency)")
    columns = [
        ("mode", "mode", "{}"),
        ("episodes", "episodes", "{}"),
        ("wall s", "wall_s", "{:.1f}"),
        ("episodes/s", "episodes_per_s", "{:.2f}"),
        ("tok/s", "tokens_per_s", "{:,.0f}"),
        ("calls/episode", "calls_per_episode", "{:.1f}"),
        ("prefilled", "prefill_tokens", "{:,}"),
        ("from cache", "prefix_cached_tokens", "{:,}"),
        ("prefill share", "prefill_share", "{:.0%}"),
        ("ms/decode step", "ms_per_decode_step", "{:.1f}"),
    ]
    for name, *_ in columns:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(fmt.format(row[key]) for _, key, fmt in columns))
    Console(width=140).print(table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        ax.plot(
            [r["episodes"] for r in mine], [r["episodes_per_s"] for r in mine], "o-", label=mode
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("episodes at once")
    ax.set_ylabel("episodes / s")
    ax.set_title("Search-agent episodes on one HFEngine")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.torch_threads)
    scratch = [f"cluster.fileroot={tempfile.mkdtemp(prefix='agent-engine-')}"]  # data, model
    config = load_config(CONFIG, [*scratch, *args.overrides, "tools.latency_s=0",
                                  "tools.latency_p99_s=0"])  # fmt: skip
    data = prepare_data(config)
    model_dir = args.model or build_or_load_model(config, data)
    tokenizer = load_tokenizer(model_dir)
    if len(data.train) < max(args.episodes):
        raise SystemExit(f"--episodes {max(args.episodes)} > the {len(data.train)} train questions")
    workflow = build_workflow(config, tokenizer)
    samples = [{**s, "seed": i} for i, s in enumerate(data.train)]
    rows = []
    try:
        for mode in args.modes:
            for n in args.episodes:
                engine = HFEngine.from_pretrained(
                    model_dir, max_batch_size=256, seed=1, prefix_cache_tokens=MODES[mode]
                )
                with engine:
                    row = {"mode": mode, **asyncio.run(run_episodes(engine, workflow, samples[:n]))}
                logger.info("%s, %d episodes: %.2f episodes/s", mode, n, row["episodes_per_s"])
                rows.append(row)
    finally:
        workflow.close()
    print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": model_dir,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.platform(),
        "args": vars(args),
    }
    (out / "agent_engine.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    plot(rows, out / "agent_engine.png")
    logger.info("wrote %s and %s", out / "agent_engine.json", out / "agent_engine.png")


if __name__ == "__main__":
    main()
