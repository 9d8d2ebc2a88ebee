"""Deployments a user triggers from the Prefect UI, and the nightly ablation on a cron schedule
(in an explicit time zone, UTC unless ``asyncrl deploy --timezone`` says otherwise).

Their entry points are the one place where a run starts from a config *path* and *overrides*
(what the UI's run form edits): each parses them once and runs what the CLI runs.
``asyncrl deploy`` registers both with the Prefect API (``PREFECT_API_URL``) and serves them from
this process: the UI's "Run" button (``POST /api/deployments/{id}/create_flow_run`` with edited
parameters) starts a flow run here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import serve
from prefect.schedules import Cron

from core.config import ConfigError, parse_config
from core.redaction import secret_overrides
from flows.ablation import DEFAULT_ALGORITHMS, ablation, ablation_variants
from flows.experiment import experiment
from tasks.redacted_flow import redacted_flow

logger = logging.getLogger(__name__)


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


@redacted_flow(name="experiment-from-yaml")
def experiment_from_yaml(
    config_path: str = "experiments/quickstart.yaml", overrides: list[str] | None = None
) -> dict[str, Any]:
    """One experiment from a config file and dotted ``key=value`` overrides."""
    _warn_on_secrets(list(overrides or []))
    with _invalid_config_for_the_ui():
        config = parse_config(config_path, list(overrides or [])).resolve()
    return experiment.fn(config)  # the experiment's body, in this flow run (no subflow)


@redacted_flow(name="ablation-from-yaml")
def ablation_from_yaml(
    config_path: str = "experiments/quickstart.yaml",
    overrides: list[str] | None = None,
    algorithms: list[str] | None = None,
    seeds: int = 1,
) -> dict[str, Any]:
    """Algorithms × seeds of a config file and overrides, compared in MLflow."""
    algorithms = list(algorithms or DEFAULT_ALGORITHMS)
    _warn_on_secrets(list(overrides or []))
    with _invalid_config_for_the_ui():
        source = parse_config(config_path, list(overrides or []))
        ablation_variants(source, algorithms, seeds)  # every variant validates before any work
    return ablation(source, algorithms, seeds)


def deployments(
    config_path: str,
    overrides: list[str],
    cron: str,
    algorithms: list[str],
    seeds: int,
    timezone: str = "UTC",
) -> list:
    """The two deployments: ``experiment`` (on demand) and ``nightly-ablation`` (``cron`` in
    ``timezone``, an IANA name: the UI shows the zone beside the time)."""
    return [
        experiment_from_yaml.to_deployment(
            name="experiment",
            parameters={"config_path": config_path, "overrides": overrides},
            description="One experiment: edit config_path and overrides (dotted key=value) before running.",
            tags=["asyncrl"],
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
            description="GRPO/PPO/DAPO (by default) × seeds, compared in MLflow.",
            tags=["asyncrl", "nightly"],
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
