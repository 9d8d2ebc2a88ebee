"""Prefect tasks: thin wrappers that call ``core`` and bind its metric sink to MLflow.

Tasks pass references (URLs, folders, run ids) between each other, never large objects.
"""
