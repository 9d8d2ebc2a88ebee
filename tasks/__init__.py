"""The layer between the flows and ``core``: Prefect tasks, and the MLflow binding flows record with.

- :mod:`tasks.stages` — the pipeline's stages as Prefect tasks (the flow's stage runner);
- :mod:`tasks.mlflow_tracking` — MLflow runs: where the store lives, params/tags, the metric
  sink ``core`` logs to, summaries, secret redaction;
- :mod:`tasks.comparison_report` — the algorithm comparison read back from MLflow: table and plot.
- :mod:`tasks.prefect_server` — Prefect's temporary API server, kept up until the flow run's end
  is recorded, and gone with the job.

Importing the package sets two Prefect defaults before Prefect is imported (the user's own
environment wins): no analytics from the embedded server (this box has no internet), and a
start-up wait for Prefect's temporary API server long enough for a busy machine — Prefect's own
20 s ran out once on this project's 2-core CI box while another job was installing packages.
"""

import os

PREFECT_STARTUP_TIMEOUT_VAR = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault(PREFECT_STARTUP_TIMEOUT_VAR, "180")
