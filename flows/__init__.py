"""Prefect flows: the experiment DAG, ablations, sweeps, deployments; and the CLI."""
