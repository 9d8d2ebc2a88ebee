"""asyncrl core: the async RL engine. Imports no Prefect and no MLflow."""
