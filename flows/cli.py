"""The ``asyncrl`` command line (typer + rich)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core.config import Config, ConfigError, docs_markdown, load_config, to_yaml

app = typer.Typer(help="Asynchronous RL for LLMs and LLM agents.", no_args_is_help=True, add_completion=False)
config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")
engine_app = typer.Typer(help="Inference engines.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")

console = Console()
err_console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="Experiment YAML, e.g. experiments/quickstart.yaml.")]
OverridesArg = Annotated[list[str] | None, typer.Argument(help="Dotted overrides: rollout.max_staleness=4 ...")]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False, rich_tracebacks=True)],
        force=True,
    )
    for noisy in ("httpx", "urllib3", "filelock", "fsspec", "botocore", "s3fs", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _load(config: Path, overrides: list[str] | None) -> Config:
    """Load and validate, or exit with status 2 and a message naming the problem."""
    try:
        return load_config(config, overrides or [])
    except ConfigError as err:
        err_console.print(f"[bold red]config error:[/] {err}")
        raise typer.Exit(code=2) from None


def _stage_progress(progress: Progress) -> Callable[[str, int | None], Callable[[int], None]]:
    def start(name: str, total: int | None) -> Callable[[int], None]:
        task = progress.add_task(name, total=total)
        if total is None:
            progress.update(task, total=1, completed=1)
        return lambda n: progress.advance(task, n)

    return start


@app.command()
def run(
    config: ConfigArg,
    overrides: OverridesArg = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run an experiment end to end and print accuracy before/after."""
    cfg = _load(config, overrides)
    if not cfg.experiment.trial:
        cfg.experiment.trial = time.strftime("%Y%m%d-%H%M%S")
    _setup_logging(verbose)
    from core.runtime.job import run_experiment

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err_console, transient=False) as progress:
        summary = run_experiment(cfg, progress=_stage_progress(progress))
    _print_summary(summary)


def _print_summary(summary: dict[str, Any]) -> None:
    table = Table(title=f"{summary['experiment']} / {summary['trial']}")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def fmt(value: Any, spec: str = ".3f") -> str:
        return "—" if value is None else format(value, spec)

    table.add_row("held-out problems", str(summary["data"]["n_test"]))
    table.add_row("accuracy before RL", fmt(summary.get("accuracy_before")))
    table.add_row("accuracy after RL", fmt(summary.get("accuracy_after")))
    evals = summary.get("evals") or []
    if evals:
        table.add_row("answer-only share before → after",
                      f"{evals[0]['direct_share']:.2f} → {evals[-1]['direct_share']:.2f}")
    table.add_row("RL steps", str(summary["steps"]))
    if "samples_per_s" in summary:
        table.add_row("samples/s (RL)", fmt(summary["samples_per_s"], ".1f"))
        table.add_row("learner busy fraction", fmt(summary["learner_busy_fraction"], ".2f"))
        table.add_row("staleness mean / max", f"{summary['mean_staleness']:.2f} / {summary['max_staleness_seen']}")
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s")
    console.print(table)
    console.print(f"run folder: {summary['run_dir']}  (summary.json, metrics.jsonl, config.yaml)")
    if summary.get("checkpoint_url"):
        console.print(f"checkpoints: {summary['checkpoint_url']}")


@config_app.command("show")
def config_show(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Print the resolved config (defaults ← preset ← YAML ← overrides)."""
    console.print(to_yaml(_load(config, overrides)), markup=False, highlight=False)


@config_app.command("docs")
def config_docs() -> None:
    """Print every config field with its type, default and help (the source of docs/config.md)."""
    print(docs_markdown(), end="")


@engine_app.command("serve")
def engine_serve(
    model: Annotated[Path, typer.Option("--model", help="Hugging Face model folder.")],
    port: Annotated[int, typer.Option(help="TCP port.")] = 30000,
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16.")] = "float32",
    max_batch_size: Annotated[int, typer.Option(help="Most requests decoded together.")] = 128,
    torch_threads: Annotated[int, typer.Option(help="torch threads for this process.")] = 1,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
) -> None:
    """Serve a model with our engine behind SGLang's HTTP API (/generate, /update_weights_from_disk, ...)."""
    if not (model / "config.json").is_file():
        err_console.print(f"[bold red]error:[/] --model {model} is not a Hugging Face model folder (no config.json)")
        raise typer.Exit(code=2)
    _setup_logging(False)
    from core.inference.server import serve

    serve(model, host, port, dtype=dtype, max_batch_size=max_batch_size, torch_threads=torch_threads, seed=seed)


if __name__ == "__main__":
    app()
