"""Seconds per published weight version vs model size, for each weight-sync mode.

What one publish costs a learner end to end, measured against our inference servers
(``python -m core.inference.server``, SGLang's HTTP API) started as processes, with generation
paused and resumed around the update as :class:`~core.inference.clients.sglang_client.SGLangClient`
does it:

- ``disk``: write the HF folder (safetensors, as the learner's export does) to a local folder;
  every server loads it; the previous version's folder is removed.
- ``disk-s3``: the same folder, uploaded to ``s3://`` on a ``moto_server`` this script starts on
  127.0.0.1; every server fetches it (fsspec, the endpoint and keys from its environment) and
  loads it; the previous version's folder and objects are removed.
- ``distributed``: the state dict goes by broadcast from this process (rank 0, gloo) to every
  server (SGLang's ``/update_weights_from_distributed``); no file is written. The group is
  opened once per set of servers, as a run does, outside the timing.

For each (model, mode, number of servers): one warm-up version, then ``--repeats`` timed ones
(median and min), the bytes of the published state dict and MB/s (those bytes over the median
time, whatever the number of servers). Servers start once per (model, number of servers) and
serve every mode in turn, with ``--torch-threads 1``.

    python experiments/benchmarks/weight_sync.py --sizes tiny,small,medium --servers 1,2

Writes ``weight_sync.json`` and ``weight_sync.png`` to ``--out`` (server logs under ``logs/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.inference.api import DEFAULT_GROUP_NAME, WeightSource
from core.inference.clients.sglang_client import SGLangClient
from core.inference.clients.sglang_launcher import (
    LaunchedServer,
    SGLangLaunchSpec,
    start,
    wait_healthy,
)
from core.inference.weight_broadcast import (
    WeightGroup,
    broadcast_tensors,
    close_group,
    open_group,
    tensor_metadata,
)
from core.models import MODEL_PRESETS, create_pretrained, load_model
from core.processes import environment
from core.storage import join, remove_dir, upload_dir
from core.training.checkpoint import export_hf
from core.training.distributed import free_port
from infra.stack import local_s3

logger = logging.getLogger("weight_sync")

MODES = ("disk", "disk-s3", "distributed")
CORPUS = [
    f"Question: Finn has {a} beads and finds {b} more. How many now?\nAnswer: {a}+{b}={a + b}. #### {a + b}"
    for a in range(20)
    for b in range(20)
]
BUCKET = "weight-sync-bench"
START_TIMEOUT_S = 120.0


def _csv(kind: type, choices: tuple[str, ...] | None = None):
    """An argparse type: a comma-separated list of ``kind``, each one of ``choices`` if given."""

    def parse(text: str) -> list:
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of {kind.__name__}: {text!r}") from None
        unknown = [x for x in items if choices is not None and x not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        type=_csv(str, tuple(MODEL_PRESETS)),
        default=["tiny", "small", "medium"],
        help="comma-separated model presets",
    )
    p.add_argument(
        "--modes",
        type=_csv(str, MODES),
        default=list(MODES),
        help=f"comma-separated weight-sync modes, of {', '.join(MODES)}",
    )
    p.add_argument(
        "--servers",
        type=_csv(int),
        default=[1, 2],
        help="comma-separated numbers of inference servers",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed versions (after 1 warm-up)")
    p.add_argument("--vocab-size", type=int, default=400)
    p.add_argument("--torch-threads", type=int, default=1, help="this process's and each server's")
    p.add_argument(
        "--workdir", default=None, help="where folders are written (default: a temp dir)"
    )
    p.add_argument("--out", default="runs/benchmarks/weight_sync")
    args = p.parse_args(argv)  # fmt: skip
    if any(n < 1 for n in args.servers):
        p.error(f"--servers: every number must be >= 1, got {args.servers}")
    for name in ("repeats", "torch_threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


# ------------------------------------------------------------------ processes


def start_servers(
    n: int, model_dir: Path, roots: list[str], env: dict[str, str], threads: int, log_dir: Path
) -> list[LaunchedServer]:
    """``n`` servers of ``model_dir`` (they load at once); stops them all if one fails."""
    extra = ["--torch-threads", str(threads)]
    for root in roots:
        extra += ["--weights-root", root]
    servers: list[LaunchedServer] = []
    try:
        for i in range(n):
            spec = SGLangLaunchSpec(model_path=str(model_dir), port=free_port(), env=env,
                                    python_executable=sys.executable,
                                    module="core.inference.server", extra_args=extra)  # fmt: skip
            servers.append(start(spec, log_dir / f"server-{i}.log", die_with_parent=True))
        for server in servers:
            wait_healthy(server, START_TIMEOUT_S)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: list[LaunchedServer]) -> None:
    for server in servers:
        server.stop(grace_s=15)


# ------------------------------------------------------------------ publishing


def serving_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a learner publishes: every tensor but a tied ``lm_head.weight``."""
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return {k: v.detach().contiguous() for k, v in state.items()}


@dataclass
class Fleet:
    """Servers of one model, the client over them, and what publishes to them."""

    client: SGLangClient
    model: torch.nn.Module
    model_dir: Path
    local_root: Path
    s3_root: str | None
    version: int = 0
    group: WeightGroup | None = None
    metadata: dict[str, list] = field(default_factory=dict)

    async def publish(self, mode: str) -> dict[str, float]:
        """One new version to every server by ``mode``; returns the seconds of each phase."""
        self.version += 1
        v = self.version
        phases: dict[str, float] = {}
        t0 = time.perf_counter()
        if mode == "distributed":
            state = serving_state(self.model)
            await self.client.pause()
            await asyncio.gather(
                self.client.update_weights_distributed(self.metadata, v, DEFAULT_GROUP_NAME),
                asyncio.to_thread(broadcast_tensors, self.group, state.values()),
            )
            await self.client.resume()
            phases["swap_s"] = time.perf_counter() - t0
        else:
            folder = self.local_root / mode / f"v{v:06d}"
            export_hf(serving_state(self.model), self.model_dir, folder, dtype=torch.float32)
            phases["export_s"] = time.perf_counter() - t0
            path = str(folder)
            if mode == "disk-s3":
                assert self.s3_root is not None
                path = join(self.s3_root, f"v{v:06d}")
                upload_dir(folder, path)
                phases["upload_s"] = time.perf_counter() - t0 - phases["export_s"]
            t1 = time.perf_counter()
            await self.client.pause()
            await self.client.update_weights(WeightSource(path=path), v)
            await self.client.resume()
            phases["swap_s"] = time.perf_counter() - t1
            # As the learner does: the previous version is done once the servers hold this one.
            shutil.rmtree(folder.parent / f"v{v - 1:06d}", ignore_errors=True)
            if mode == "disk-s3":
                remove_dir(join(self.s3_root, f"v{v - 1:06d}"))
        phases["seconds"] = time.perf_counter() - t0
        versions = await self.client.server_versions()
        if versions != [v] * len(versions):
            raise RuntimeError(f"{mode}: servers report versions {versions}, expected {v}")
        return phases

    async def open_group(self, n_servers: int) -> None:
        port = free_port()
        _, self.group = await asyncio.gather(
            self.client.init_weight_group("127.0.0.1", port, DEFAULT_GROUP_NAME, "gloo"),
            asyncio.to_thread(open_group, "127.0.0.1", port, 0, 1 + n_servers,
                              DEFAULT_GROUP_NAME, "gloo", 60.0),
        )  # fmt: skip
        self.metadata = tensor_metadata(serving_state(self.model))

    async def close_group(self) -> None:
        if self.group is None:
            return
        try:
            await self.client.destroy_weight_group(DEFAULT_GROUP_NAME)
        finally:
            close_group(self.group)
            self.group = None


async def measure_fleet(
    fleet: Fleet, modes: list[str], repeats: int, n_servers: int
) -> list[dict[str, Any]]:
    """Every mode against one set of servers: a warm-up version, then ``repeats`` timed."""
    rows = []
    try:
        for mode in modes:
            if mode == "distributed":
                await fleet.open_group(n_servers)
            await fleet.publish(mode)  # warm-up
            runs = [await fleet.publish(mode) for _ in range(repeats)]
            times = [r["seconds"] for r in runs]
            row: dict[str, Any] = {"mode": mode, "servers": n_servers,
                                   "seconds": statistics.median(times), "min_s": min(times),
                                   "times": times}  # fmt: skip
            for phase in ("export_s", "upload_s", "swap_s"):
                if phase in runs[0]:
                    row[phase] = statistics.median(r[phase] for r in runs)
            rows.append(row)
            logger.info("%s, %d server(s): %.3f s/version", mode, n_servers, row["seconds"])
            if mode == "distributed":
                await fleet.close_group()
    finally:
        await fleet.close_group()
        await fleet.client.aclose()
    return rows


def measure_size(
    preset: str, args: argparse.Namespace, work: Path, s3_env: dict[str, str], log_dir: Path
) -> list[dict[str, Any]]:
    """Every (number of servers, mode) for one model preset."""
    model_dir = create_pretrained(
        preset, CORPUS, work / preset / "model", vocab_size=args.vocab_size, seed=0
    )
    model = load_model(model_dir)
    state = serving_state(model)
    n_params = sum(p.numel() for p in model.parameters())
    n_bytes = sum(t.numel() * t.element_size() for t in state.values())
    logger.info("%s: %.1f M parameters, %.1f MB published", preset, n_params / 1e6, n_bytes / 1e6)
    s3_root = f"s3://{BUCKET}/{preset}" if s3_env else None
    rows = []
    for n in args.servers:
        local_root = work / preset / f"published-{n}"
        roots = [str(local_root)] + ([s3_root] if s3_root else [])
        servers = start_servers(n, model_dir, roots, s3_env, args.torch_threads,
                                log_dir / f"{preset}-{n}")  # fmt: skip
        try:
            client = SGLangClient([s.address for s in servers])
            fleet = Fleet(client, model, model_dir, local_root, s3_root and f"{s3_root}/{n}")
            fleet_rows = asyncio.run(measure_fleet(fleet, args.modes, args.repeats, n))
        finally:
            stop_servers(servers)
        shutil.rmtree(local_root, ignore_errors=True)
        for row in fleet_rows:
            rows.append({"model": preset, "params": n_params, "state_bytes": n_bytes, **row,
                         "mb_per_s": n_bytes / 1e6 / row["seconds"]})  # fmt: skip
    return rows


# ------------------------------------------------------------------ report


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Seconds per published weight version (pause, update, resume)")
    columns = [("model", "model", "{}"), ("params", "params", "{:,}"),
               ("state MB", "state_bytes", "{:.1f}"), ("mode", "mode", "{}"),
               ("servers", "servers", "{}"), ("s/version (median)", "seconds", "{:.3f}"),
               ("min s", "min_s", "{:.3f}"), ("MB/s", "mb_per_s", "{:,.0f}"),
               ("write s", "export_s", "{:.3f}"), ("upload s", "upload_s", "{:.3f}"),
               ("servers' update s", "swap_s", "{:.3f}")]  # fmt: skip
    for name, *_ in columns:
        table.add_column(name, justify="right")
    for row in rows:
        cells = {**row, "state_bytes": row["state_bytes"] / 1e6}
        table.add_row(*(fmt.format(cells[key]) if key in cells else "-" for _, key, fmt in columns))
    Console(width=140).print(table)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    colours = dict(zip(MODES, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        for n in dict.fromkeys(r["servers"] for r in rows):
            mine = sorted((r for r in rows if r["mode"] == mode and r["servers"] == n),
                          key=lambda r: r["params"])  # fmt: skip
            ax.plot([r["params"] / 1e6 for r in mine], [r["seconds"] for r in mine],
                    "o-" if n == 1 else "s--", color=colours[mode],
                    label=f"{mode}, {n} server{'s' * (n > 1)}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model parameters (millions)")
    ax.set_ylabel("seconds per published version")
    ax.set_title("Weight sync cost vs model size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # a line per S3 client otherwise
    torch.set_num_threads(args.torch_threads)
    out = Path(args.out)
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="weight-sync-", dir=args.workdir)
            )
        )
        s3_env: dict[str, str] = {}
        if "disk-s3" in args.modes:
            s3_env = stack.enter_context(local_s3(log_dir, BUCKET, free_port()))
            stack.enter_context(environment(s3_env))  # this process uploads with the same keys
        rows = [row for preset in args.sizes for row in measure_size(preset, args, work, s3_env,
                                                                     log_dir)]  # fmt: skip
    print_table(rows)
    meta = {"torch": torch.__version__, "torch_threads": args.torch_threads,
            "machine": platform.platform(), "cpus": os.cpu_count(),
            "workdir": args.workdir or tempfile.gettempdir(),
            "wall_s": time.perf_counter() - started, "args": vars(args)}  # fmt: skip
    result = {"meta": meta, "results": rows}
    (out / "weight_sync.json").write_text(json.dumps(result, indent=2))
    plot(rows, out / "weight_sync.png")
    logger.info("wrote %s and %s", out / "weight_sync.json", out / "weight_sync.png")
    return result


if __name__ == "__main__":
    main()
