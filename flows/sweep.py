"""Hyper-parameter sweep: an Optuna study whose trials are experiment subflows.

The search space is YAML, keyed by config paths::

    objective: accuracy              # or accuracy_per_second
    direction: maximize
    params:
      rollout.max_staleness: {type: categorical, choices: [0, 1, 2, 4, 8]}
      algorithm.lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
      algorithm.group_size: {type: int, low: 4, high: 8, step: 4}

Each trial is an MLflow child run under one parent run; held-out evals during RL are reported to
the trial, and Optuna's MedianPruner stops unpromising trials early. The study lives in sqlite
under the experiment folder by default (any RDB URL works).

``parallel`` trials run at once, each in its own process (:mod:`flows.parallel`), asked of and
told to the study here; ``"auto"`` fits them to this machine's cores, which on a small box means
``study.optimize`` one trial after another, in this process. With trials in flight together,
TPE suggests from the trials finished so far, so the suggestions differ from a sequential study.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import optuna
from omegaconf import OmegaConf
from prefect.artifacts import create_markdown_artifact

from core.config import Config, ConfigError, ConfigSource
from core.storage import is_local, join, local_path, write_json
from flows.experiment import experiment
from flows.parallel import (
    VariantJob,
    VariantPool,
    VariantStopped,
    parse_parallel,
    prepare_shared_data,
    resolve_parallelism,
)
from tasks.mlflow_tracking import start_run
from tasks.redacted_flow import redacted_flow

logger = logging.getLogger(__name__)

OBJECTIVES = ("accuracy", "accuracy_per_second")
KINDS = ("categorical", "float", "int")


@dataclass
class SearchSpace:
    """Parsed and validated search space."""

    params: dict[str, dict[str, Any]]
    objective: str = "accuracy"
    direction: str = "maximize"
    extra: dict[str, Any] = field(default_factory=dict)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        values = {}
        for key, spec in self.params.items():
            kind = spec["type"]
            if kind == "categorical":
                values[key] = trial.suggest_categorical(key, list(spec["choices"]))
            elif kind == "float":
                values[key] = trial.suggest_float(
                    key, spec["low"], spec["high"], log=bool(spec.get("log", False))
                )
            else:
                values[key] = trial.suggest_int(
                    key, spec["low"], spec["high"], step=int(spec.get("step", 1))
                )
        return values

    def extremes(self, source: ConfigSource) -> list[Config]:
        """The base config and one per choice, low and high of each param: what the most
        demanding trial may need (a space may vary ranks or threads)."""
        probes = [
            {key: value}
            for key, spec in self.params.items()
            for value in (
                spec["choices"] if spec["type"] == "categorical" else (spec["low"], spec["high"])
            )
        ]
        return [source.resolve(), *(source.resolve(p, label="sweep space") for p in probes)]

    def value(self, summary: dict[str, Any]) -> float:
        """The trial's objective from its experiment summary."""
        accuracy = summary["accuracy_after"]
        if accuracy is None:
            accuracy = summary["accuracy_before"]
        if self.objective == "accuracy_per_second":
            return accuracy / max(summary["wall_seconds"], 1e-9)
        return accuracy


def load_space(path: str | Path, source: ConfigSource) -> SearchSpace:
    """Read the space and check every key against the config before any trial runs."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"search space file not found: {path}")
    raw = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(raw, dict) or not isinstance(raw.get("params"), dict) or not raw["params"]:
        raise ValueError(f"{path}: needs a non-empty 'params' mapping of config keys to specs")
    space = SearchSpace(
        params=raw["params"],
        objective=raw.get("objective", "accuracy"),
        direction=raw.get("direction", "maximize"),
    )
    if space.objective not in OBJECTIVES:
        raise ValueError(f"{path}: objective={space.objective!r} is not one of {list(OBJECTIVES)}")
    if space.direction not in ("maximize", "minimize"):
        raise ValueError(f"{path}: direction={space.direction!r} must be maximize or minimize")
    for key, spec in space.params.items():
        if not isinstance(spec, dict) or spec.get("type") not in KINDS:
            raise ValueError(f"{path}: params.{key} needs type one of {list(KINDS)}")
        probe = spec["choices"][0] if spec["type"] == "categorical" else spec["low"]
        try:  # the key must exist in the schema and accept this kind of value
            source.resolve({key: probe}, label=str(path))
        except ConfigError as err:
            raise ValueError(f"{path}: params.{key}: {err}") from None
    return space


def default_storage(fileroot: str, experiment_name: str) -> str:
    root = (
        local_path(join(fileroot, experiment_name))
        if not is_local(fileroot)
        else Path(fileroot) / experiment_name
    )
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root.resolve() / 'optuna.db'}"


@redacted_flow(name="sweep", validate_parameters=False)
def sweep(
    source: ConfigSource,
    space: SearchSpace,
    n_trials: int = 8,
    storage: str | None = None,
    study_name: str | None = None,
    parallel: int | str = "auto",
) -> dict[str, Any]:
    """Run ``n_trials`` trials, ``parallel`` at a time (``"auto"`` or a number); returns the
    study name, storage, best parameters and value."""
    requested = parse_parallel(parallel)
    base = source.resolve()
    stamp = base.experiment.trial or time.strftime("%Y%m%d-%H%M%S")
    study_name = study_name or f"{base.experiment.name}-sweep-{stamp}"
    storage = storage or default_storage(base.cluster.fileroot, base.experiment.name)
    study = optuna.create_study(
        study_name=study_name,
        storage=storage,
        direction=space.direction,
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=base.experiment.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0),
    )
    n, why = resolve_parallelism(requested, space.extremes(source))
    n = min(n, max(1, n_trials))
    logger.info("sweep of %d trial(s), %d at a time: %s", n_trials, n, why)
    child_runs: dict[int, str] = {}
    tags = {"kind": "sweep", "optuna_study": study_name, "parallel": n}
    with start_run(base, run_name=study_name, tags=tags) as parent:
        parent_id = parent.info.run_id

        def trial_job(trial: optuna.Trial) -> VariantJob:
            name = f"trial-{trial.number}"
            values = {**space.suggest(trial), "experiment.trial": f"{stamp}-{name}"}
            config = source.resolve(values, label=f"sweep {name}")

            def report(version: int, accuracy: float) -> None:
                trial.report(accuracy, version)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"accuracy {accuracy:.3f} at version {version}")

            return VariantJob(name, config, parent_id, name, f"{study_name}-{name}", report)

        def objective(trial: optuna.Trial) -> float:
            job = trial_job(trial)
            result = experiment.with_options(flow_run_name=job.flow_run_name)(
                job.config, parent_run_id=parent_id, run_name=job.run_name, on_eval=job.on_eval
            )
            child_runs[trial.number] = result["mlflow_run_id"]
            return space.value(result["summary"])

        if n == 1:
            study.optimize(objective, n_trials=n_trials, catch=())
        else:
            _optimize_in_processes(study, trial_job, space, n_trials, n, child_runs)
        experiment_name = base.tracking.mlflow_experiment or base.experiment.name
        _tag_trials(study, child_runs, parent_id, experiment_name)
        completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        best = None
        if completed:
            best = {
                "params": study.best_params,
                "value": study.best_value,
                "number": study.best_trial.number,
            }
        result = {
            "study_name": study_name,
            "storage": storage,
            "n_trials": len(study.trials),
            "states": {t.number: t.state.name for t in study.trials},
            "best": best,
            "mlflow_parent_run_id": parent_id,
        }
        if best:
            mlflow.MlflowClient().log_dict(parent_id, best, "best_params.json")
        write_json(join(base.cluster.fileroot, base.experiment.name, f"{study_name}.json"), result)
        create_markdown_artifact(markdown=_markdown(study, best), key="sweep-result")
    return result


def _optimize_in_processes(
    study: optuna.Study,
    trial_job: Callable[[optuna.Trial], VariantJob],
    space: SearchSpace,
    n_trials: int,
    parallel: int,
    child_runs: dict[int, str],
) -> None:
    """``study.optimize`` with ``parallel`` trials in flight, each in its own process.

    Ask-and-tell: trials are asked here, in trial-number order, and told as they finish. As with
    ``catch=()``, the first failed trial stops the others (told FAIL) and is raised; so does
    anything that interrupts this loop (SIGTERM).
    """
    failure: BaseException | None = None
    asked = 0
    running: dict[cf.Future, optuna.Trial] = {}
    with VariantPool(parallel) as pool:
        try:
            while running or (asked < n_trials and failure is None):
                while asked < n_trials and failure is None and len(running) < parallel:
                    trial = study.ask()
                    asked += 1
                    try:
                        job = trial_job(trial)
                        prepare_shared_data([job.config])
                    except BaseException:
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                        raise
                    running[pool.submit(job)] = trial
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: running[f].number):
                    trial = running.pop(future)
                    error = _tell(study, trial, future, space, child_runs)
                    if error is not None and failure is None:
                        logger.error(
                            "trial %d failed (%s); stopping the others", trial.number, error
                        )
                        failure = error
                        pool.stop()
        except BaseException:
            pool.stop()
            for trial in running.values():
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
    if failure is not None:
        raise failure


def _tell(
    study: optuna.Study,
    trial: optuna.Trial,
    future: cf.Future,
    space: SearchSpace,
    child_runs: dict[int, str],
) -> BaseException | None:
    """Tell the study how a finished trial ended; returns its error when it failed on its own."""
    error = future.exception()
    if error is None:
        result = future.result()
        child_runs[trial.number] = result["mlflow_run_id"]
        study.tell(trial, space.value(result["summary"]))
        return None
    if isinstance(error, optuna.TrialPruned):
        logger.info("trial %d pruned: %s", trial.number, error)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return None
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return None if isinstance(error, VariantStopped) else error


def _tag_trials(
    study: optuna.Study, child_runs: dict[int, str], parent_id: str, experiment_name: str
) -> None:
    """Mark each trial's MLflow child run with its Optuna state (pruned runs raise, so find them by name)."""
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(experiment_name)
    children = (
        client.search_runs(
            [exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
        )
        if exp
        else []
    )
    by_name = {run.info.run_name: run.info.run_id for run in children}
    for trial in study.trials:
        run_id = child_runs.get(trial.number) or by_name.get(f"trial-{trial.number}")
        if run_id:
            client.set_tag(run_id, "optuna_state", trial.state.name)
            client.set_tag(run_id, "optuna_trial", str(trial.number))


def _markdown(study: optuna.Study, best: dict[str, Any] | None) -> str:
    lines = [
        f"# Sweep {study.study_name}",
        "",
        "| trial | state | value | params |",
        "|---|---|---|---|",
    ]
    for t in study.trials:
        value = "—" if t.value is None else f"{t.value:.4f}"
        lines.append(f"| {t.number} | {t.state.name} | {value} | {t.params} |")
    if best:
        lines += ["", f"**best**: {best['params']} → {best['value']:.4f}"]
    return "\n".join(lines) + "\n"
