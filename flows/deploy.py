"""Deployments a user triggers from the Prefect UI, and the nightly ablation on a cron schedule.

``asyncrl deploy`` registers both with the Prefect API (``PREFECT_API_URL``) and serves them
from this process: the UI's "Run" button (``POST /api/deployments/{id}/create_flow_run`` with
edited parameters) starts a flow run here.
"""

from __future__ import annotations

from prefect import serve

from flows.ablation import ablation
from flows.experiment import experiment


def deployments(
    config_path: str, overrides: list[str], cron: str, algorithms: list[str], seeds: int
) -> list:
    """The two deployments: ``experiment`` (on demand) and ``nightly-ablation`` (cron)."""
    return [
        experiment.to_deployment(
            name="experiment",
            parameters={"config_path": config_path, "overrides": overrides},
            description="One experiment: edit config_path and overrides (dotted key=value) before running.",
            tags=["asyncrl"],
        ),
        ablation.to_deployment(
            name="nightly-ablation",
            cron=cron,
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
) -> None:
    """Register and serve until interrupted (SIGTERM pauses the deployments' schedules)."""
    serve(
        *deployments(
            config_path,
            list(overrides or []),
            cron,
            list(algorithms or ["grpo", "ppo", "dapo"]),
            seeds,
        )
    )
