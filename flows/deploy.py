"""Deployments a user triggers from the Prefect UI, and the nightly ablation on a cron schedule
(in an explicit time zone, UTC unless ``asyncrl deploy --timezone`` says otherwise).

Their entry points are the one place where a run starts from a config *path* and the run form's
fields: typed ones (:mod:`flows.run_form`: algorithm, max_staleness, total_steps, lr, seed,
fileroot) and free dotted ``key=value`` overrides for the rest. Each parses them once and runs
what the CLI runs.

``asyncrl deploy`` registers both with the Prefect API (``PREFECT_API_URL``) and either serves
them from this process, or (``--work-pool NAME``) registers them on a work pool, where a
``prefect worker start --pool NAME`` on any machine with asyncrl installed runs them. Either way
the UI's "Run" button (``POST /api/deployments/{id}/create_flow_run`` with edited parameters)
starts a flow run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import deploy, serve
from prefect.deployments.runner import EntrypointType
from prefect.schedules import Cron

from core.config import ConfigError, ConfigSource
from core.redaction import secret_overrides
from flows.ablation import DEFAULT_ALGORITHMS, ablation, ablation_variants
from flows.experiment import experiment
from flows.run_form import (
    Algorithm,
    Algorithms,
    ConfigPath,
    Fileroot,
    LearningRate,
    MaxStaleness,
    Overrides,
    Parallel,
    Seed,
    Seeds,
    TotalSteps,
    form_source,
    form_values,
)
from tasks.redacted_flow import redacted_flow

logger = logging.getLogger(__name__)

CONFIG_DOCS = "docs/config.md"


def _warn_on_secrets(overrides: list[str]) -> None:
    """Prefect stored these parameters as the run form sent them: say so if one held a secret."""
    for override in secret_overrides(overrides):
        logger.warning(
            "override %s holds a secret, which Prefect has stored with this flow run's "
            "parameters; put it in the worker's environment as key=${oc.env:NAME} instead",
            override,
        )


@contextmanager
def _invalid_config_for_the_ui() -> Iterator[None]:
    """A config error fails the flow run before any work, with a message the UI shows."""
    try:
        yield
    except ConfigError as err:
        raise ValueError(f"invalid config: {err}") from None


def _form_source(config_path: str, overrides: list[str] | None, **fields: Any) -> ConfigSource:
    """The run form's config: the file, the free overrides and the typed fields (unset ones
    left out); warns when an override held a secret, fails in the UI's terms when invalid."""
    overrides = list(overrides or [])
    _warn_on_secrets(overrides)
    with _invalid_config_for_the_ui():
        return form_source(config_path, overrides, form_values(**fields))


@redacted_flow(name="experiment-from-yaml")
def experiment_from_yaml(
    config_path: ConfigPath = "experiments/quickstart.yaml",
    algorithm: Algorithm = None,
    max_staleness: MaxStaleness = None,
    total_steps: TotalSteps = None,
    lr: LearningRate = None,
    seed: Seed = None,
    fileroot: Fileroot = None,
    overrides: Overrides = None,
) -> dict[str, Any]:
    """One experiment from a config file, the run form's typed fields and free overrides."""
    source = _form_source(
        config_path, overrides, algorithm=algorithm, max_staleness=max_staleness,
        total_steps=total_steps, lr=lr, seed=seed, fileroot=fileroot,
    )  # fmt: skip
    with _invalid_config_for_the_ui():
        config = source.resolve()
    return experiment.fn(config)  # the experiment's body, in this flow run (no subflow)


@redacted_flow(name="ablation-from-yaml")
def ablation_from_yaml(
    config_path: ConfigPath = "experiments/quickstart.yaml",
    algorithms: Algorithms = None,
    seeds: Seeds = 1,
    parallel: Parallel = "auto",
    max_staleness: MaxStaleness = None,
    total_steps: TotalSteps = None,
    lr: LearningRate = None,
    seed: Seed = None,
    fileroot: Fileroot = None,
    overrides: Overrides = None,
) -> dict[str, Any]:
    """Algorithms × seeds of a config file, typed fields and overrides, compared in MLflow."""
    algorithms = list(algorithms or DEFAULT_ALGORITHMS)
    source = _form_source(
        config_path, overrides, max_staleness=max_staleness, total_steps=total_steps, lr=lr,
        seed=seed, fileroot=fileroot,
    )  # fmt: skip
    with _invalid_config_for_the_ui():
        ablation_variants(source, algorithms, seeds)  # every variant validates before any work
    return ablation(source, algorithms, seeds, parallel)  # parallel: "auto" or a number


def deployments(
    config_path: str,
    overrides: list[str],
    cron: str,
    algorithms: list[str],
    seeds: int,
    timezone: str = "UTC",
    **options: Any,
) -> list:
    """The two deployments: ``experiment`` (on demand) and ``nightly-ablation`` (``cron`` in
    ``timezone``, an IANA name: the UI shows the zone beside the time). ``options`` go to both
    ``to_deployment`` calls (e.g. ``entrypoint_type``, ``job_variables``)."""
    return [
        experiment_from_yaml.to_deployment(
            name="experiment",
            parameters={"config_path": config_path, "overrides": overrides},
            description="One experiment. Edit the run form's fields (empty = as in the config "
            f"file); other config keys go in overrides as dotted key=value, see {CONFIG_DOCS}.",
            tags=["asyncrl"],
            **options,
        ),
        ablation_from_yaml.to_deployment(
            name="nightly-ablation",
            schedule=Cron(cron, timezone=timezone),
            parameters={
                "config_path": config_path,
                "overrides": overrides,
                "algorithms": algorithms,
                "seeds": seeds,
            },
            description="GRPO/PPO/DAPO (by default) × seeds, compared in MLflow. Other config "
            f"keys go in overrides as dotted key=value, see {CONFIG_DOCS}.",
            tags=["asyncrl", "nightly"],
            **options,
        ),
    ]


def serve_deployments(
    config_path: str = "experiments/quickstart.yaml",
    overrides: list[str] | None = None,
    cron: str = "0 2 * * *",
    algorithms: list[str] | None = None,
    seeds: int = 1,
    timezone: str = "UTC",
) -> None:
    """Register and serve until interrupted (SIGTERM pauses the deployments' schedules)."""
    algorithms = list(algorithms or DEFAULT_ALGORITHMS)
    logger.info("nightly-ablation: cron %r in time zone %s", cron, timezone)
    serve(*deployments(config_path, list(overrides or []), cron, algorithms, seeds, timezone))


def ensure_work_pool(name: str, pool_type: str = "process") -> str:
    """The work pool ``name``, created with ``pool_type``'s default job template if absent;
    returns its type. Raises ValueError for a type no installed Prefect worker provides."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.base import BaseWorker

    with get_client(sync_client=True) as client:
        try:
            return client.read_work_pool(name).type
        except ObjectNotFound:
            pass
        worker = BaseWorker.get_worker_class_from_type(pool_type)
        if worker is None:
            raise ValueError(
                f"work pool type {pool_type!r} has no Prefect worker installed here "
                "(process is built in; docker needs prefect-docker, kubernetes prefect-kubernetes)"
            )
        template = worker.get_default_base_job_template()
        client.create_work_pool(
            WorkPoolCreate(name=name, type=pool_type, base_job_template=template)
        )
        logger.info("created work pool %r (type %s)", name, pool_type)
        return pool_type


def deploy_to_work_pool(
    pool: str,
    config_path: str = "experiments/quickstart.yaml",
    overrides: list[str] | None = None,
    cron: str = "0 2 * * *",
    algorithms: list[str] | None = None,
    seeds: int = 1,
    timezone: str = "UTC",
    pool_type: str = "process",
    working_dir: Path | None = None,
) -> list[UUID]:
    """Register both deployments on the work pool ``pool`` (created if absent); returns their ids.

    No image and no code upload: the entry points are referenced by module path
    (``flows.deploy.experiment_from_yaml``), which a worker imports from its own asyncrl install.
    On a process pool, flow runs start in ``working_dir`` on the worker (default: this process's
    directory; Prefect's default would be a temporary folder, deleted with the run's local
    outputs), so a relative config path and the default fileroot resolve as with ``asyncrl run``.
    """
    job_variables: dict[str, str] = {}
    kind = ensure_work_pool(pool, pool_type)
    if kind == "process":
        job_variables["working_dir"] = str((working_dir or Path.cwd()).resolve())
    elif working_dir is not None:
        logger.warning("work pool %r is of type %s: its job template sets the folder, not "
                       "--working-dir %s", pool, kind, working_dir)  # fmt: skip
    algorithms = list(algorithms or DEFAULT_ALGORITHMS)
    logger.info("nightly-ablation: cron %r in time zone %s", cron, timezone)
    return deploy(
        *deployments(
            config_path,
            list(overrides or []),
            cron,
            algorithms,
            seeds,
            timezone,
            entrypoint_type=EntrypointType.MODULE_PATH,
            job_variables=job_variables,
        ),
        work_pool_name=pool,
        build=False,
        push=False,
        print_next_steps_message=False,
        ignore_warnings=True,
    )
