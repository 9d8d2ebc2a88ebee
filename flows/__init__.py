"""Prefect flows: the experiment DAG, ablations, sweeps, deployments; and the CLI."""

import tasks  # noqa: F401  (Prefect's start-up defaults, set before Prefect is first imported)
