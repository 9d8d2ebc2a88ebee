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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import optuna
from omegaconf import OmegaConf
from prefect.artifacts import create_markdown_artifact

from core.config import ConfigError, ConfigSource
from core.storage import is_local, join, local_path, write_json
from flows.experiment import experiment
from tasks.mlflow_tracking import start_run
from tasks.redacted_flow import redacted_flow

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
) -> dict[str, Any]:
    """Run ``n_trials`` trials; returns the study name, storage, best parameters and value."""
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
    child_runs: dict[int, str] = {}
    tags = {"kind": "sweep", "optuna_study": study_name}
    with start_run(base, run_name=study_name, tags=tags) as parent:
        parent_id = parent.info.run_id

        def objective(trial: optuna.Trial) -> float:
            name = f"trial-{trial.number}"
            values = {**space.suggest(trial), "experiment.trial": f"{stamp}-{name}"}
            config = source.resolve(values, label=f"sweep {name}")

            def report(version: int, accuracy: float) -> None:
                trial.report(accuracy, version)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"accuracy {accuracy:.3f} at version {version}")

            result = experiment.with_options(flow_run_name=f"{study_name}-{name}")(
                config, parent_run_id=parent_id, run_name=name, on_eval=report
            )
            child_runs[trial.number] = result["mlflow_run_id"]
            summary = result["summary"]
            accuracy = summary["accuracy_after"]
            if accuracy is None:
                accuracy = summary["accuracy_before"]
            if space.objective == "accuracy_per_second":
                return accuracy / max(summary["wall_seconds"], 1e-9)
            return accuracy

        study.optimize(objective, n_trials=n_trials, catch=())
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
