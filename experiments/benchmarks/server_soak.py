"""Soak test of our engine server: mixed valid and malformed load for minutes, watching it hold up.

    python experiments/benchmarks/server_soak.py --seconds 180 --out runs/benchmarks/server_soak

Starts ``core.inference.server`` as its own process (on a tiny Qwen2 built on the fly unless
``--model``) with an API key and a ``--max-new-tokens-cap``, then runs closed-loop clients for
``--seconds``: ``--valid-clients`` send well-formed requests (single, batched, seeded), and
``--malformed-clients`` send one of many bad requests each (out-of-vocabulary, negative and
float ids, NaN temperature, huge budgets, broken JSON, list/null bodies, deep nesting, unknown
fields, no or wrong API key, weight updates from outside the allowed roots or with negative
versions). Every answer is classed *expected* (200 for valid, the right 4xx for malformed) or
*unexpected* (5xx, a wrong status, a malformed 200, a timeout, a dropped connection).

Reports per kind of request: counts, unexpected ones, p50/p99 latency; the server's RSS over
time (growth from the first sample after ``--warmup-s``, and its slope). Writes
``server_soak.json`` and ``server_soak.png`` (RSS and valid-request latency over time) to
``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from core.inference.clients.http_client import API_KEY_ENV, auth_headers
from core.inference.clients.sglang_launcher import LaunchedServer, SGLangLaunchSpec, launch
from core.models import create_pretrained
from core.training.distributed import free_port

REPO = Path(__file__).resolve().parents[2]
CORPUS = [
    f"Question: Finn has {a} beads and finds {b} more. How many now?\nAnswer: {a}+{b}={a + b}. #### {a + b}"
    for a in range(12)
    for b in range(12)
]
VOCAB = 300  # the tiny model's tokenizer; its embedding has a few more rows


@dataclass
class Probe:
    """One kind of request: how to send it and which status is the right answer."""

    method: str
    path: str
    expect: int
    body: Callable[[random.Random], Any] | None = None  # JSON body
    raw: Callable[[random.Random], bytes] | None = None  # raw bytes instead
    auth: str = "key"  # "key", "none" or "wrong"
    max_new_tokens: int = 0  # for valid /generate: the most tokens an answer may have


def _prompt(rng: random.Random, n: int = 12) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, n))]


def valid_probes(max_new: int) -> dict[str, Probe]:
    sampled = {"max_new_tokens": max_new, "temperature": 1.0, "top_p": 0.9, "top_k": 50}
    greedy = {"max_new_tokens": max_new, "temperature": 0.0}

    def single(rng):
        return {"input_ids": _prompt(rng), "sampling_params": sampled, "return_logprob": True}

    def batch(rng):
        prompts = [_prompt(rng) for _ in range(4)]
        return {"input_ids": prompts, "sampling_params": greedy, "return_logprob": True}

    def seeded(rng):
        params = {**sampled, "sampling_seed": rng.randrange(2**62)}
        return {"input_ids": _prompt(rng), "sampling_params": params, "return_logprob": True}

    return {
        name: Probe("POST", "/generate", 200, body, max_new_tokens=max_new)
        for name, body in (
            ("valid_single", single),
            ("valid_batch4", batch),
            ("valid_seeded", seeded),
        )
    }


def malformed_probes(model_dir: str) -> dict[str, Probe]:
    """Each bad request and the status it must get (never a 5xx)."""
    outside = "/asyncrl-soak-outside/v1"  # not under the model folder's parent (unless that is /)

    def gen(**patch: Any) -> Callable[[random.Random], Any]:
        def body(rng: random.Random) -> dict[str, Any]:
            base = {"input_ids": _prompt(rng), "sampling_params": {"max_new_tokens": 4}}
            for key, value in patch.items():
                base[key] = value(rng) if callable(value) else value
            return base

        return body

    def sampling(**params: Any) -> Callable[[random.Random], Any]:
        return gen(sampling_params={"max_new_tokens": 4, **params})

    deep = b"[" * 50_000
    return {
        "oov_id": Probe("POST", "/generate", 400, gen(input_ids=lambda r: [5, 10**6 + r.randrange(9)])),
        "negative_id": Probe("POST", "/generate", 400, gen(input_ids=[5, -3, 7])),
        "float_id": Probe("POST", "/generate", 400, gen(input_ids=[5.0, 6, 7])),
        "nan_temperature": Probe("POST", "/generate", 400, sampling(temperature="nan")),
        "huge_max_new_tokens": Probe("POST", "/generate", 400, sampling(max_new_tokens=10**12)),
        "bad_top_p": Probe("POST", "/generate", 400, sampling(top_p=7)),
        "unknown_field": Probe("POST", "/generate", 400, sampling(frequency_penlty=1.0)),  # misspelt
        "bad_json": Probe("POST", "/generate", 400, raw=lambda r: b'{"input_ids": [1, 2'),
        "list_body": Probe("POST", "/generate", 400, raw=lambda r: b"[[1, 2, 3]]"),
        "null_body": Probe("POST", "/generate", 400, raw=lambda r: b"null"),
        "deep_nesting": Probe("POST", "/generate", 400, raw=lambda r: deep),
        "huge_int": Probe("POST", "/generate", 400, raw=lambda r: b'{"input_ids": [' + b"7" * 6000 + b"]}"),
        "no_api_key": Probe("POST", "/pause_generation", 401, lambda r: {"mode": "abort"}, auth="none"),
        "wrong_api_key": Probe("POST", "/generate", 401, gen(), auth="wrong"),
        "weights_outside_roots": Probe("POST", "/update_weights_from_disk", 400, lambda r: {"model_path": outside}),
        "negative_weight_version": Probe(
            "POST", "/update_weights_from_disk", 400, lambda r: {"model_path": model_dir, "weight_version": -7}
        ),
    }  # fmt: skip


@dataclass
class Tally:
    """What happened to one kind of request."""

    sent: int = 0
    expected: int = 0
    unexpected: int = 0
    server_errors: int = 0  # 5xx
    timeouts: int = 0
    latencies: list[float] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)  # a few unexpected answers, for the report

    def add(self, ok: bool, latency: float, status: int | None, note: str = "") -> None:
        self.sent += 1
        self.latencies.append(latency)
        if ok:
            self.expected += 1
            return
        self.unexpected += 1
        self.server_errors += status is not None and status >= 500
        self.timeouts += note == "timeout"
        if len(self.samples) < 5:
            self.samples.append(f"{status}: {note[:200]}")


def _well_formed(data: Any, max_new: int) -> bool:
    answers = data if isinstance(data, list) else [data]
    for answer in answers:
        meta = answer["meta_info"]
        triples = meta["output_token_logprobs"]
        if not 0 < len(answer["output_ids"]) <= max_new or len(triples) != len(
            answer["output_ids"]
        ):
            return False
        if not all(isinstance(t[0], float) and math.isfinite(t[0]) and t[0] <= 0 for t in triples):
            return False
    return True


class Load:
    """Closed-loop clients against one server, tallied per kind of request."""

    def __init__(self, url: str, key: str, timeout_s: float, seed: int) -> None:
        self.url = url
        self.headers = {"key": auth_headers(key), "none": {},
                        "wrong": {"Authorization": "Bearer not-the-key"}}  # fmt: skip
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.seed = seed
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        self.timeline: list[tuple[float, float]] = []  # (elapsed s, latency s) of valid requests

    async def send(self, session: aiohttp.ClientSession, name: str, probe: Probe, rng) -> None:
        kwargs: dict[str, Any] = {"headers": self.headers[probe.auth]}
        if probe.raw is not None:
            kwargs["data"] = probe.raw(rng)
            kwargs["headers"] = {**kwargs["headers"], "Content-Type": "application/json"}
        elif probe.body is not None:
            kwargs["json"] = probe.body(rng)
        start = time.perf_counter()
        status, note = None, ""
        try:
            async with session.request(probe.method, self.url + probe.path, **kwargs) as r:
                status = r.status
                text = await r.text()
            ok = status == probe.expect
            if ok and probe.expect == 200:
                ok = _well_formed(json.loads(text), probe.max_new_tokens)
            note = "" if ok else text
        except TimeoutError:
            ok, note = False, "timeout"
        except (aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:
            ok, note = False, repr(exc)
        latency = time.perf_counter() - start
        self.tallies[name].add(ok, latency, status, note)
        if probe.expect == 200:
            self.timeline.append((time.perf_counter() - self.started, latency))

    async def client(self, index: int, probes: dict[str, Probe], pause_s: float, deadline: float):
        rng = random.Random(self.seed * 1000 + index)
        names = sorted(probes)
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            while time.perf_counter() < deadline:
                name = rng.choice(names)
                await self.send(session, name, probes[name], rng)
                if pause_s:
                    await asyncio.sleep(pause_s)

    async def run(self, valid: dict, malformed: dict, args: argparse.Namespace) -> None:
        self.started = time.perf_counter()
        deadline = self.started + args.seconds
        clients = [self.client(i, valid, 0.0, deadline) for i in range(args.valid_clients)]
        clients += [
            self.client(1000 + i, malformed, args.malformed_pause_s, deadline)
            for i in range(args.malformed_clients)
        ]
        await asyncio.gather(*clients)


class RssSampler:
    """The server process's resident memory, sampled every ``every_s`` seconds on a thread."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.process = psutil.Process(pid)
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []  # (elapsed s, RSS MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.process.memory_info().rss / 2**20
            except psutil.Error:
                return
            self.samples.append((time.perf_counter() - self.started, rss))
            self._stop.wait(self.every_s)


# ---------------------------------------------------------------------- summary


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _slope_mib_per_min(samples: list[tuple[float, float]]) -> float | None:
    if len(samples) < 3:
        return None
    xs, ys = [t for t, _ in samples], [m for _, m in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else None


def memory_summary(samples: list[tuple[float, float]], warmup_s: float) -> dict[str, Any]:
    """RSS from the first sample after the warm-up to the end: growth, peak and slope."""
    steady = [s for s in samples if s[0] >= warmup_s] or samples
    if not steady:
        return {}
    return {
        "rss_start_mib": steady[0][1],
        "rss_end_mib": steady[-1][1],
        "rss_peak_mib": max(m for _, m in steady),
        "rss_growth_mib": steady[-1][1] - steady[0][1],
        "rss_slope_mib_per_min": _slope_mib_per_min(steady),
    }


def summarize(tallies: dict[str, Tally], valid: set[str], elapsed_s: float) -> dict[str, Any]:
    rows = []
    for name in sorted(tallies, key=lambda n: (n not in valid, n)):
        t = tallies[name]
        rows.append({
            "kind": name,
            "valid": name in valid,
            "sent": t.sent,
            "expected": t.expected,
            "unexpected": t.unexpected,
            "server_errors": t.server_errors,
            "timeouts": t.timeouts,
            "p50_s": _percentile(t.latencies, 0.5),
            "p99_s": _percentile(t.latencies, 0.99),
            "unexpected_samples": t.samples,
        })  # fmt: skip
    valid_latencies = [lat for n in valid for lat in tallies[n].latencies]
    totals = {
        "valid_sent": sum(r["sent"] for r in rows if r["valid"]),
        "malformed_sent": sum(r["sent"] for r in rows if not r["valid"]),
        "unexpected": sum(r["unexpected"] for r in rows),
        "server_errors": sum(r["server_errors"] for r in rows),
        "timeouts": sum(r["timeouts"] for r in rows),
        "valid_p50_s": _percentile(valid_latencies, 0.5),
        "valid_p99_s": _percentile(valid_latencies, 0.99),
    }
    totals["unexpected_rate"] = totals["unexpected"] / max(1, sum(r["sent"] for r in rows))
    totals["requests_per_s"] = sum(r["sent"] for r in rows) / max(elapsed_s, 1e-9)
    return {"rows": rows, "totals": totals}


def print_table(summary: dict[str, Any], memory: dict[str, Any]) -> None:
    table = Table(title="Engine server soak")
    for name in ("kind", "sent", "expected", "unexpected", "5xx", "timeouts", "p50 ms", "p99 ms"):
        table.add_column(name, justify="left" if name == "kind" else "right")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{1000 * value:.1f}"

    for r in summary["rows"]:
        table.add_row(r["kind"], str(r["sent"]), str(r["expected"]), str(r["unexpected"]),
                      str(r["server_errors"]), str(r["timeouts"]), ms(r["p50_s"]), ms(r["p99_s"]))  # fmt: skip
    console = Console(width=120)
    console.print(table)
    t = summary["totals"]
    console.print(
        f"valid {t['valid_sent']} / malformed {t['malformed_sent']} requests "
        f"({t['requests_per_s']:.0f}/s); unexpected {t['unexpected']} "
        f"({t['server_errors']} 5xx, {t['timeouts']} timeouts); valid p50 {ms(t['valid_p50_s'])} ms, "
        f"p99 {ms(t['valid_p99_s'])} ms"
    )
    if memory:
        slope = memory["rss_slope_mib_per_min"]
        console.print(
            f"server RSS {memory['rss_start_mib']:.0f} → {memory['rss_end_mib']:.0f} MiB "
            f"(growth {memory['rss_growth_mib']:+.1f} MiB, peak {memory['rss_peak_mib']:.0f}, "
            f"slope {'-' if slope is None else f'{slope:+.2f}'} MiB/min)"
        )


def plot(rss: list[tuple[float, float]], timeline: list[tuple[float, float]], path: Path) -> None:
    fig = Figure(figsize=(9, 4))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    if rss:
        left.plot([t for t, _ in rss], [m for _, m in rss])
    left.set_xlabel("seconds")
    left.set_ylabel("server RSS (MiB)")
    left.set_title("Server memory")
    buckets: dict[int, list[float]] = defaultdict(list)
    width = max(1, int(max((t for t, _ in timeline), default=1) // 30) or 1)
    for t, latency in timeline:
        buckets[int(t // width)].append(latency)
    xs = sorted(buckets)
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        right.plot(
            [x * width for x in xs], [1000 * _percentile(buckets[x], q) for x in xs], label=label
        )
    right.set_xlabel("seconds")
    right.set_ylabel("valid request latency (ms)")
    right.set_title(f"Valid requests ({width} s buckets)")
    right.legend()
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=180.0, help="how long to apply the load")
    p.add_argument("--model", default=None, help="HF model folder (default: build a tiny model)")
    p.add_argument("--valid-clients", type=int, default=8, help="closed-loop well-formed clients")
    p.add_argument("--malformed-clients", type=int, default=4, help="closed-loop bad clients")
    p.add_argument(
        "--malformed-pause-s", type=float, default=0.01, help="pause between a bad client's sends"
    )
    p.add_argument("--max-new-tokens", type=int, default=16, help="budget of valid requests")
    p.add_argument("--max-new-tokens-cap", type=int, default=64, help="the server's cap")
    p.add_argument("--request-timeout-s", type=float, default=30.0, help="longer = a timeout")
    p.add_argument("--rss-every-s", type=float, default=1.0)
    p.add_argument("--warmup-s", type=float, default=5.0, help="RSS growth is counted after this")
    p.add_argument("--torch-threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/benchmarks/server_soak")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.valid_clients < 1 or args.malformed_clients < 0:
        p.error("--seconds must be > 0, --valid-clients >= 1, --malformed-clients >= 0")
    if not 1 <= args.max_new_tokens <= args.max_new_tokens_cap:
        p.error("--max-new-tokens must be in [1, --max-new-tokens-cap]")
    return args


def start(args: argparse.Namespace, model_dir: str, key: str, log: Path) -> LaunchedServer:
    spec = SGLangLaunchSpec(
        model_path=model_dir,
        port=free_port(),
        python_executable=sys.executable,
        module="core.inference.server",
        extra_args=[
            "--torch-threads", str(args.torch_threads),
            "--max-new-tokens-cap", str(args.max_new_tokens_cap),
            "--log-level", "warning",
        ],
        # The key goes by environment, not on the command line; /health needs none.
        env={API_KEY_ENV: key, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return launch(spec, log, health_timeout_s=180, poll_s=0.2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or str(
        create_pretrained("tiny", CORPUS, Path(tempfile.mkdtemp(prefix="soak-")) / "tiny",
                          vocab_size=VOCAB, seed=0)
    )  # fmt: skip
    key = secrets.token_urlsafe(24)
    valid, malformed = valid_probes(args.max_new_tokens), malformed_probes(model_dir)
    with start(args, model_dir, key, out / "server.log") as server:
        load = Load(server.url, key, args.request_timeout_s, args.seed)
        started = time.perf_counter()
        with RssSampler(server.proc.pid, args.rss_every_s) as sampler:
            asyncio.run(load.run(valid, malformed, args))
        elapsed = time.perf_counter() - started
        alive = server.alive()
    summary = summarize(load.tallies, set(valid), elapsed)
    memory = memory_summary(sampler.samples, args.warmup_s)
    print_table(summary, memory)
    result = {
        "meta": {
            "model": model_dir,
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
            "args": vars(args),
            "elapsed_s": elapsed,
            "server_alive_at_end": alive,
        },
        "summary": summary,
        "memory": memory,
        "rss_samples": sampler.samples,
    }
    (out / "server_soak.json").write_text(json.dumps(result, indent=2))
    plot(sampler.samples, load.timeline, out / "server_soak.png")
    print(f"results: {out / 'server_soak.json'}, {out / 'server_soak.png'}")
    return result


if __name__ == "__main__":
    main()
