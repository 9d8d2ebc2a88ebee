"""MLflow binding for runs: where the store lives, one run per job, metrics, summaries, no secrets.

``core`` never imports mlflow; it talks to a :class:`core.runtime.metrics.MetricSink`. This module
binds that interface to MLflow (:class:`MLflowSink`) and wraps run bookkeeping around a job.

Where things go (chosen on purpose: left alone, MLflow writes ``mlflow.db`` and ``mlruns/`` into
whatever the current directory happens to be):

* Tracking store — ``config.tracking.mlflow_uri`` when set (a server such as the local stack's
  ``http://127.0.0.1:5000``, or any store URI); else the standard ``MLFLOW_TRACKING_URI``
  environment variable (``asyncrl stack up`` prints it). Otherwise an embedded sqlite file: for a local
  fileroot ``{fileroot}/mlflow.db``; for a remote fileroot (``s3://...``) sqlite cannot live on
  object storage, so the file lives in a local cache folder
  ``${XDG_CACHE_HOME:-~/.cache}/asyncrl/mlflow/<hash of fileroot>/mlflow.db``. Runs of one remote
  fileroot on *one machine* then share a store; several machines need a tracking server.
* Artifacts — ``{fileroot}/mlartifacts`` (a ``file://`` URI for a local fileroot; for ``s3://``
  boto3 honours ``MLFLOW_S3_ENDPOINT_URL``/``AWS_ENDPOINT_URL`` and the AWS keys in the env).
  Exception: a *tracking server* with a *local* fileroot — a ``file://`` path on this machine is
  unreadable from the server/UI, so the server's own (proxied) artifact root is used instead.

``start_run`` logs which store and fileroot a run uses, and why. It points MLflow's fluent API at
the store without leaving ``MLFLOW_TRACKING_URI`` in the environment (``mlflow.set_tracking_uri``
exports it), so the variable keeps meaning what the user set: the next run in this process, with
another fileroot, still finds its own embedded store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from core.config import Config, flatten, to_yaml
from core.config.loading import fileroot_origin
from core.redaction import redact, redact_value
from core.runtime.metrics import finite_numbers
from core.storage import is_local, join, local_path

logger = logging.getLogger(__name__)

MAX_PARAM_CHARS = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_TAG_CHARS = 8000  # MAX_TAG_VAL_LENGTH
MAX_KEY_CHARS = 250  # MAX_ENTITY_KEY_LENGTH
BATCH_PARAMS = 100  # MAX_PARAMS_TAGS_PER_BATCH
BATCH_METRICS = 1000  # MAX_METRICS_PER_BATCH
MAX_MODEL_ARTIFACT_BYTES = 50 * 2**20
_REPO_ROOT = Path(__file__).resolve().parent.parent
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
# MLflow 3's UI opens an experiment on its GenAI (traces) pages unless this tag says it trains
# models: then the runs table and charts come first.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"

# ------------------------------------------------------------------------------------------
# Where the store and the artifacts live
# ------------------------------------------------------------------------------------------


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def tracking_uri(config: Config) -> str:
    """``config.tracking.mlflow_uri``, ``MLFLOW_TRACKING_URI`` or the embedded sqlite store."""
    return tracking_choice(config)[0]


def tracking_choice(config: Config) -> tuple[str, str]:
    """The tracking URI and why it was chosen (see the module docstring)."""
    if config.tracking.mlflow_uri:
        return config.tracking.mlflow_uri, "tracking.mlflow_uri"
    if env := os.environ.get(TRACKING_URI_ENV, "").strip():
        return env, f"from {TRACKING_URI_ENV}; tracking.mlflow_uri is empty"
    reason = f"embedded store; tracking.mlflow_uri and {TRACKING_URI_ENV} are empty"
    return _embedded_uri(config), reason


def _embedded_uri(config: Config) -> str:
    """The sqlite store beside a local fileroot, or in a cache folder for a remote one."""
    root = config.cluster.fileroot
    if is_local(root):
        folder = Path(root.removeprefix("file://")).expanduser().resolve()
    else:
        digest = hashlib.sha256(root.rstrip("/").encode()).hexdigest()[:16]
        folder = _cache_home() / "asyncrl" / "mlflow" / digest
    return f"sqlite:///{folder / 'mlflow.db'}"


def artifact_location(config: Config) -> str:
    """``{fileroot}/mlartifacts``: an absolute ``file://`` URI locally, the URL itself remotely."""
    root = config.cluster.fileroot
    if is_local(root):
        return (Path(root.removeprefix("file://")).expanduser().resolve() / "mlartifacts").as_uri()
    return f"{root.rstrip('/')}/mlartifacts"


def _is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://", "databricks"))


def run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI for an http(s) tracking server, else None.

    The link carries no credentials or query: it is shown to people and stored in Prefect.
    """
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return None
    host = parts.netloc.rpartition("@")[2]
    base = urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def as_url(location: str) -> str:
    """A full URL: a local path becomes an absolute ``file://`` URL, a URL stays as it is."""
    if is_local(location):
        return Path(location.removeprefix("file://")).expanduser().resolve().as_uri()
    return location


# The run's model folders (core.runtime): a remote run works on local staging copies of them.
_MODEL_FOLDERS = ("final", "sft", "model_init")


def _model_url(summary: Mapping[str, Any]) -> str | None:
    """Where the run's final model lives: ``final_model_dir``, else the checkpoints.

    A run on a remote fileroot reports its local staging copy (:func:`core.storage.local_path`)
    of ``{run_dir}/final``; the URL it was uploaded to is the one worth a tag.
    """
    model_dir = summary.get("final_model_dir")
    if not model_dir:
        return summary.get("checkpoint_url")
    run_dir = str(summary.get("run_dir") or "")
    if run_dir and not is_local(run_dir):
        for name in _MODEL_FOLDERS:
            if local_path(join(run_dir, name)) == Path(str(model_dir)):
                return join(run_dir, name)
    return str(model_dir)


def _use_tracking_uri(uri: str) -> None:
    """Point MLflow's fluent API at ``uri`` for this process, keeping the environment as it was.

    ``mlflow.set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI``; left there, it would read
    as the user's choice for the next run in this process (see the module docstring).
    """
    before = os.environ.get(TRACKING_URI_ENV)
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop(TRACKING_URI_ENV, None)
    else:
        os.environ[TRACKING_URI_ENV] = before


def experiment_name(config: Config) -> str:
    return config.tracking.mlflow_experiment or config.experiment.name


def ensure_experiment(config: Config) -> str:
    """The experiment's id, creating it (with our artifact location) when missing."""
    uri = tracking_uri(config)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri)
    name = experiment_name(config)
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        if existing.lifecycle_stage == "deleted":
            # Deleted in the UI but asked for again: runs cannot start in a deleted experiment,
            # and the name stays taken until garbage-collected, so bring it back.
            logger.warning("restoring deleted MLflow experiment %r", name)
            client.restore_experiment(existing.experiment_id)
        return existing.experiment_id
    location: str | None = artifact_location(config)
    if _is_server(uri) and is_local(config.cluster.fileroot):
        location = None  # let the server store (proxy) them: see the module docstring
    try:
        experiment_id = client.create_experiment(
            name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: "custom_model_development"}
        )
    except mlflow.exceptions.MlflowException:
        # Lost a race with a concurrent task creating the same experiment.
        existing = client.get_experiment_by_name(name)
        if existing is None:
            raise
        return existing.experiment_id
    logger.info(
        "created MLflow experiment %r (artifacts: %s) in %s", name, location, redact_value(uri)
    )
    return experiment_id


# ------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------


def git_commit(cwd: Path = _REPO_ROOT) -> str:
    """HEAD of the repository holding this code, or ``"unknown"`` (no git, not a checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _prefect_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run
    except ImportError:
        return None
    run_id = flow_run.id
    return str(run_id) if run_id else None


def sanitize_key(key: str) -> str:
    """Map a name onto MLflow's charset (alphanumerics ``_ - . / : space``) and path rules."""
    key = re.sub(r"[^\w.\-/: ]", "_", str(key))
    key = re.sub(r"/+", "/", key).strip("/")  # no leading '/', no '//'
    parts = [p if p not in (".", "..") else p.replace(".", "_") for p in key.split("/")]
    return "/".join(parts)[:MAX_KEY_CHARS] or "_"


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_tags(config: Config, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The tags every run carries (plus ``extra``), redacted and truncated."""
    tags: dict[str, Any] = {
        "algorithm": config.method,
        "model": config.model.path,
        "max_staleness": config.rollout.max_staleness,
        "git_commit": git_commit(),
        "experiment_trial": config.experiment.trial,
        # The UI's "Source" column: else MLflow names the file that called start_run (Prefect's
        # engine.py inside a flow run).
        "mlflow.source.name": f"asyncrl {config.experiment.name}",
        "mlflow.source.type": "JOB",
    }
    if (flow_run_id := _prefect_flow_run_id()) is not None:
        tags["prefect_flow_run_id"] = flow_run_id
    tags.update(extra or {})
    return {sanitize_key(k): _truncate(str(v), MAX_TAG_CHARS) for k, v in redact(tags).items()}


def log_params(client: MlflowClient, run_id: str, params: Mapping[str, Any]) -> None:
    """Redacted, truncated params, 100 per ``log_batch`` call (MLflow's batch limit)."""
    clean = [
        Param(sanitize_key(k), _truncate(str(v), MAX_PARAM_CHARS))
        for k, v in redact(params).items()
    ]
    for i in range(0, len(clean), BATCH_PARAMS):
        client.log_batch(run_id, params=clean[i : i + BATCH_PARAMS])


@contextmanager
def start_run(
    config: Config,
    *,
    run_name: str | None = None,
    parent_run_id: str | None = None,
    tags: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """An MLflow run for one job: config as params, standard tags, ``config.yaml`` artifact.

    Sets the tracking URI *for this process* (MLflow's fluent API is process-global), and logs
    which store and fileroot the run uses, and why. With
    ``parent_run_id`` the run is nested under it (it may live in another process: a sweep's
    parent run). ``params`` are extra params beside the flattened config. The run ends FAILED
    when the body raises.
    """
    uri, why = tracking_choice(config)
    root = config.cluster.fileroot
    logger.info("MLflow store %s (%s); run files under %s (%s)", redact_value(uri), why,
                redact_value(root), fileroot_origin(config))  # fmt: skip
    experiment_id = ensure_experiment(config)
    _use_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name,
                          nested=parent_run_id is not None, parent_run_id=parent_run_id,
                          tags=run_tags(config, tags)) as run:  # fmt: skip
        run_id = run.info.run_id
        log_params(client, run_id, {**flatten(config), **(params or {})})
        config_yaml = to_yaml(config, redacted=True)
        client.log_text(run_id, config_yaml, "config.yaml")
        logger.info(
            "MLflow run %s (%s) in %s", run_id, run_name or run.info.run_name, redact_value(uri)
        )
        yield run


class MLflowSink:
    """A :class:`core.runtime.metrics.MetricSink` writing to one MLflow run.

    Callable from the train-loop thread: calls are serialised by a lock. Keys are mapped onto
    MLflow's charset; None/NaN/inf and non-numbers are dropped. A failed write is logged and
    counted (``failures``), never raised: a tracking hiccup must not kill a long training run.
    """

    def __init__(self, run_id: str, tracking_uri: str | None = None) -> None:
        self.run_id = run_id
        self.client = MlflowClient(tracking_uri=tracking_uri or mlflow.get_tracking_uri())
        self.failures = 0
        self._lock = threading.Lock()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        rows = [
            Metric(sanitize_key(k), v, now, int(step)) for k, v in finite_numbers(metrics).items()
        ]
        if not rows:
            return
        with self._lock:
            try:
                for i in range(0, len(rows), BATCH_METRICS):
                    self.client.log_batch(self.run_id, metrics=rows[i : i + BATCH_METRICS])
            except Exception as err:  # any client/transport error: see the class docstring
                self.failures += 1
                logger.warning("MLflow: dropped %d metrics at step %d (%s)", len(rows), step, err)


def _log_file_as(client: MlflowClient, run_id: str, path: Path, name: str) -> None:
    """Log ``path`` as artifact ``name`` (MLflow keeps a file's own name: copy when they differ)."""
    folder, _, filename = sanitize_key(name).rpartition("/")
    if filename == path.name:
        client.log_artifact(run_id, str(path), folder or None)
        return
    with tempfile.TemporaryDirectory(prefix="asyncrl-artifact-") as tmp:
        staged = Path(tmp) / filename
        shutil.copyfile(path, staged)
        client.log_artifact(run_id, str(staged), folder or None)


def _folder_bytes(folder: Path, limit: int) -> int:
    total = 0
    for file in folder.rglob("*"):
        if file.is_file():
            total += file.stat().st_size
            if total > limit:
                break  # no need to walk a huge folder to the end
    return total


def log_summary(
    run_id: str,
    summary: Mapping[str, Any],
    files: Mapping[str, Path] | None = None,
    *,
    folders: Mapping[str, Path] | None = None,
    tracking_uri: str | None = None,
    max_model_bytes: int = MAX_MODEL_ARTIFACT_BYTES,
) -> None:
    """Close a run's record: ``summary.json``, ``final/<key>`` metrics, extra files, the model.

    Numeric top-level values become metrics ``final/<key>`` (``final/accuracy_after``). ``files``
    maps artifact names (``"curves.png"``, or ``"plots/curves.png"``) to local files, ``folders``
    artifact folder names (``"tensorboard"``) to local folders (logged when they exist). The model
    URL (``final_model_dir``, or the remote folder a staging copy mirrors, else
    ``checkpoint_url``) becomes the tag ``model_url`` beside ``checkpoint_url``, both full URLs
    (a local path as an absolute ``file://`` URL); a local model folder under
    ``max_model_bytes`` is also copied under the ``model/`` artifacts.
    """
    client = MlflowClient(tracking_uri=tracking_uri or mlflow.get_tracking_uri())
    clean = redact(summary)
    client.log_text(
        run_id, json.dumps(clean, indent=2, sort_keys=True, default=str) + "\n", "summary.json"
    )
    now = int(time.time() * 1000)
    metrics = [
        Metric(sanitize_key(f"final/{k}"), float(v), now, 0)
        for k, v in clean.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    for name, path in (files or {}).items():
        _log_file_as(client, run_id, Path(path), name)
    for name, folder in (folders or {}).items():
        if Path(folder).is_dir():
            client.log_artifacts(run_id, str(folder), sanitize_key(name))
    tags = {k: as_url(str(clean[k])) for k in ("checkpoint_url",) if clean.get(k)}
    if model_url := _model_url(summary):
        tags["model_url"] = as_url(redact_value(str(model_url)))
    if tags:
        client.log_batch(
            run_id, tags=[RunTag(k, _truncate(v, MAX_TAG_CHARS)) for k, v in tags.items()]
        )
    model_dir = summary.get("final_model_dir")
    if model_dir and is_local(str(model_dir)):
        folder = Path(str(model_dir).removeprefix("file://"))
        if folder.is_dir():
            size = _folder_bytes(folder, max_model_bytes)
            if size <= max_model_bytes:
                client.log_artifacts(run_id, str(folder), "model")
            else:
                logger.info(
                    "model folder %s is over %d bytes: logged as a URL only",
                    folder,
                    max_model_bytes,
                )
