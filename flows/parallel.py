"""Run an ablation's variants or a sweep's trials side by side, each in its own process.

How many at once (:func:`resolve_parallelism`): ``"auto"`` divides this machine's cores by what
one variant keeps busy (:func:`variant_cpus`: its learner ranks and rollout worker, each with
``scheduler.torch_threads`` threads, plus its reward verifier processes; with GPUs also by the
GPUs it asks for), so a small box runs them one after another; a number forces that many.

Why processes, not threads: a run sets process-wide state — torch's thread count and global RNG
(a preset model is built under ``torch.manual_seed``; with ``learner.n_ranks=1`` the learner
trains in the driver), signal handlers, ``ray.init``, MLflow's fluent tracking URI — which two
runs in one process would share. So each variant is the ``experiment`` subflow in a spawned
process (:class:`VariantPool`): the parent flow run's Prefect context is handed over, so the
subflow still hangs under the ablation or sweep flow run, and its MLflow run nests under the
parent run by id. A held-out eval in the child is answered by the parent's ``on_eval`` (Optuna's
pruning), over a pipe. When one variant fails, the others are stopped (SIGTERM, which unwinds a
run and its workers) and the first failure is raised; a child also stops if its parent dies.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import dataclasses
import logging
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from types import FrameType, TracebackType
from typing import Any

import cloudpickle

from core.config import Config
from core.processes import environment
from core.runtime.fleet import launches_servers
from core.storage import exists, join

logger = logging.getLogger(__name__)

AUTO = "auto"
STOP_GRACE_S = 120.0  # a stopped run may commit a checkpoint (checkpoint.on_signal) first
_PR_SET_PDEATHSIG = 1

EvalHook = Callable[[int, float], None]


# ------------------------------------------------------------------------------------------
# How many at once
# ------------------------------------------------------------------------------------------


def parse_parallel(value: int | str) -> int | None:
    """``"auto"`` → None, a whole number >= 1 (or its text) → itself; else ValueError."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        n = 0 if isinstance(value, bool | float) else int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"parallel must be 'auto' or a whole number >= 1, got {value!r}")
    return n


def variant_cpus(config: Config) -> int:
    """Cores one run keeps busy: each learner rank, the rollout worker and each server it
    launches run ``scheduler.torch_threads`` threads, each reward verifier process one; with
    ``scheduler.type=ray`` at least the CPUs it reserves."""
    threads = max(1, config.scheduler.torch_threads)
    processes = config.learner.n_ranks + 1 + launched_servers(config)
    need = processes * threads + config.rollout.reward_workers
    if config.scheduler.type == "ray":
        reserved = config.scheduler.learner_cpus + config.scheduler.rollout_cpus
        need = max(need, math.ceil(reserved))
    return need


def variant_gpus(config: Config) -> int:
    """GPUs one run asks for: one per learner rank, one per engine or server it starts itself."""
    if not config.cluster.n_gpus_per_node:
        return 0
    own = 1 if config.inference.engine == "hf" else launched_servers(config)
    return config.learner.n_ranks + own


def launched_servers(config: Config) -> int:
    """How many inference servers one run launches (inference.engine=sglang, no addresses)."""
    return config.inference.n_servers if launches_servers(config) else 0


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_parallelism(
    requested: int | None, configs: Sequence[Config], *, cores: int | None = None
) -> tuple[int, str]:
    """How many of ``configs`` run at once, and why (a line for the log).

    ``requested`` None is *auto*: this machine's cores (``cores``, default
    :func:`available_cores`) over the most any config needs, and as many of
    ``cluster.n_gpus_per_node`` GPUs, at least 1. Never more than there are configs.
    """
    assert configs, "nothing to run"
    count = len(configs)
    if requested is not None:
        n = min(requested, count)
        capped = f", capped at the {count} to run" if n < requested else ""
        return n, f"parallel={requested} (asked){capped}"
    cores = available_cores() if cores is None else cores
    widest = max(configs, key=variant_cpus)
    cpus = variant_cpus(widest)
    fits = cores // cpus
    s = widest.scheduler
    why = (
        f"auto: {cores} core(s) / {cpus} per run ({widest.learner.n_ranks} learner rank(s) "
        f"+ rollout worker, × {s.torch_threads} torch thread(s), "
        f"+ {widest.rollout.reward_workers} reward worker(s)"
        + (
            f"; {s.learner_cpus + s.rollout_cpus:g} CPUs reserved in Ray)"
            if s.type == "ray"
            else ")"
        )
    )
    gpus = max(variant_gpus(c) for c in configs)
    if gpus:
        have = max(c.cluster.n_gpus_per_node for c in configs)
        fits = min(fits, have // gpus)
        why += f", {have} GPU(s) / {gpus} per run"
    n = max(1, min(fits, count))
    return n, f"{why} → {n}" + (" (one after another)" if n == 1 else " at once")


# ------------------------------------------------------------------------------------------
# Shared inputs
# ------------------------------------------------------------------------------------------


def prepare_shared_data(configs: Iterable[Config]) -> None:
    """Write each data cache the configs share once, here, before they run at the same time.

    Runs with the same data config and seed read one cache folder, whose files are written in
    place: a second run could read a half-written ``train.jsonl`` while the first writes it.
    """
    from core.runtime.stages import data_cache_url, prepare_data

    seen: set[str] = set()
    for config in configs:
        url = data_cache_url(config)
        if url not in seen and not exists(join(url, "train.jsonl")):
            logger.info("preparing the data shared by concurrent runs: %s", url)
            prepare_data(config)
        seen.add(url)


# ------------------------------------------------------------------------------------------
# One variant in its own process
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class VariantJob:
    """One experiment subflow to run: its config, names, and the parent MLflow run."""

    name: str  # in logs and errors: "grpo-s1", "trial-3"
    config: Config
    parent_run_id: str
    run_name: str
    flow_run_name: str
    on_eval: EvalHook | None = None  # called here, in the parent; may raise to stop the run


class VariantError(RuntimeError):
    """A variant's process ended without a result, or failed with an error that did not pickle."""


class VariantStopped(VariantError):
    """The variant was stopped (or never started) because another one failed."""


class VariantPool:
    """Up to ``parallel`` variants at a time, each in a spawned process; a context manager.

    Create it inside the parent flow run (it captures the Prefect context there). Leaving the
    ``with`` block stops any variant still running, whatever ended it (an error, SIGTERM).
    """

    def __init__(self, parallel: int, *, stop_grace_s: float = STOP_GRACE_S) -> None:
        self.parallel = parallel
        self.stop_grace_s = stop_grace_s
        self._api_url, self._context = _prefect_context()
        self._log_level = logging.getLogger().getEffectiveLevel()
        self._threads = cf.ThreadPoolExecutor(parallel, thread_name_prefix="variant")
        self._live: dict[str, mp.process.BaseProcess] = {}
        self._exiting: list[mp.process.BaseProcess] = []
        self._futures: list[cf.Future] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def __enter__(self) -> VariantPool:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is not None or self._live:
            self.stop()
        for future in self._futures:
            future.cancel()  # those not started
        cf.wait(self._futures)
        # Reap before the threads end: a child's parent-death signal follows the thread that
        # started it, and one may still be exiting (flushing its logs) after its answer.
        deadline = time.monotonic() + self.stop_grace_s
        for process in self._exiting:
            _reap(process, deadline)
        self._threads.shutdown(wait=True)

    def submit(self, job: VariantJob) -> cf.Future:
        """Run ``job`` when a slot is free; the future holds the experiment's result."""
        future = self._threads.submit(self._run, job)
        self._futures.append(future)
        return future

    def stop(self) -> None:
        """Stop every running variant (SIGTERM, then SIGKILL after the grace period)."""
        self._stopping.set()
        with self._lock:
            live = dict(self._live)
        for name, process in live.items():
            logger.warning("stopping variant %s (pid %s)", name, process.pid)
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + self.stop_grace_s
        for process in live.values():
            _reap(process, deadline)

    # -------------------------------------------------------------- parent side of one job
    def _run(self, job: VariantJob) -> dict[str, Any]:
        bare = dataclasses.replace(job, on_eval=None)  # the hook stays here; the child asks it
        payload = cloudpickle.dumps(
            (bare, job.on_eval is not None, self._context, self._log_level, os.getpid())
        )
        ctx = mp.get_context("spawn")  # a fresh interpreter: no torch, Prefect or MLflow state
        with self._lock:  # stop() either sees this process or it is never started
            if self._stopping.is_set():
                raise VariantStopped(f"variant {job.name} was not started: another one failed")
            conn, child_conn = ctx.Pipe()
            process = ctx.Process(target=_variant_main, args=(child_conn, payload), name=job.name)
            # In the child's environment from its first line (its __main__ may load Prefect's
            # settings before our code runs): threads outside the flow's context (log shipping,
            # a progress reporter) must find this API too, not start a server of their own.
            with environment({"PREFECT_API_URL": self._api_url}):
                process.start()
            self._live[job.name] = process
        child_conn.close()
        logger.info("variant %s started (pid %s)", job.name, process.pid)
        try:
            return self._serve(job, conn, process)
        finally:
            # Its answer is in: the process exits on its own (Prefect flushes its logs first,
            # seconds on a busy box), reaped when the pool closes; its slot is free now.
            with self._lock:
                self._exiting.append(self._live.pop(job.name))
            conn.close()

    def _serve(self, job: VariantJob, conn: Any, process: Any) -> dict[str, Any]:
        """Answer the child's eval reports until it sends its result or its error."""
        while True:
            try:
                message = conn.recv()
            except EOFError:
                process.join(5)
                if self._stopping.is_set():
                    raise VariantStopped(f"variant {job.name} was stopped") from None
                raise VariantError(
                    f"variant {job.name} (pid {process.pid}) exited with code "
                    f"{process.exitcode} without a result"
                ) from None
            kind = message[0]
            if kind == "eval":
                conn.send(_answer_eval(job, *message[1:]))
            elif kind == "ok":
                logger.info("variant %s finished", job.name)
                return message[1]
            else:
                raise self._failure(job, process, *message[1:])

    def _failure(
        self, job: VariantJob, process: Any, blob: bytes | None, text: str
    ) -> BaseException:
        if self._stopping.is_set():  # whatever it raised while it unwound
            return VariantStopped(f"variant {job.name} was stopped")
        error = _loads(blob)
        if not isinstance(error, Exception):  # unpicklable, or SystemExit/KeyboardInterrupt
            return VariantError(f"variant {job.name} (pid {process.pid}) failed:\n{text}")
        error.add_note(f"in variant {job.name} (pid {process.pid}), whose traceback was:\n{text}")
        return error


def _reap(process: mp.process.BaseProcess, deadline: float) -> None:
    """Wait for ``process`` to exit until ``deadline`` (monotonic), then kill it."""
    process.join(max(0.0, deadline - time.monotonic()))
    if process.is_alive():
        logger.error("variant %s did not exit in time: killing pid %s", process.name, process.pid)
        process.kill()
        process.join(5)


def run_all(jobs: Sequence[VariantJob], parallel: int) -> list[dict[str, Any]]:
    """Run every job, ``parallel`` at a time; results in ``jobs`` order.

    The first failure stops the others and is raised (as the sequential loop would raise it).
    """
    with VariantPool(parallel) as pool:
        futures = [pool.submit(job) for job in jobs]
        cf.wait(futures, return_when=cf.FIRST_EXCEPTION)
        failed = [(job, f) for job, f in zip(jobs, futures, strict=True) if _failed(f)]
        if failed:
            job, future = failed[0]
            others = [j.name for j, f in zip(jobs, futures, strict=True) if not f.done()]
            logger.error("variant %s failed; stopping %s", job.name, others or "nothing else")
            pool.stop()
            cf.wait(futures)
            _end_stopped_runs([j for j in jobs if j.name in others])
            raise future.exception()  # type: ignore[misc]
        return [f.result() for f in futures]


def _end_stopped_runs(jobs: Sequence[VariantJob]) -> None:
    """End as KILLED the MLflow runs that stopped variants left RUNNING.

    A variant unwinds on SIGTERM and ends its own run, but it can die first (killed after the
    grace period) or find the embedded sqlite store locked by a write it was interrupted in; its
    process is gone now, so this one can end the run for it.
    """
    from mlflow.tracking import MlflowClient

    from tasks.mlflow_tracking import ensure_experiment, tracking_uri

    for job in jobs:
        try:
            client = MlflowClient(tracking_uri=tracking_uri(job.config))
            left = client.search_runs(
                [ensure_experiment(job.config)],
                filter_string=f"tags.mlflow.runName = '{job.run_name}' "
                f"and attributes.status = 'RUNNING'",
            )
            for run in left:
                if run.data.tags.get("mlflow.parentRunId") == job.parent_run_id:
                    client.set_terminated(run.info.run_id, "KILLED")
                    logger.warning("ended variant %s's MLflow run %s as KILLED", job.name,
                                   run.info.run_id)  # fmt: skip
        except Exception:  # the variant's own error is the one to raise
            logger.exception("could not end variant %s's MLflow run", job.name)


def _failed(future: cf.Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None


def _answer_eval(job: VariantJob, version: int, accuracy: float) -> tuple[str, bytes | None]:
    assert job.on_eval is not None, "the child reports evals only when on_eval is set"
    try:
        job.on_eval(version, accuracy)
    except Exception as err:  # e.g. optuna.TrialPruned: the child raises it in its run
        return "raise", cloudpickle.dumps(err)
    return "continue", None


def _prefect_context() -> tuple[str, dict[str, Any]]:
    """The API this process talks to, and the current flow run's context pinned to it.

    Without a PREFECT_API_URL Prefect starts a temporary server per process: the children use
    this process's instead, so their subflow runs land in the same database.
    """
    from prefect.client.orchestration import get_client
    from prefect.context import serialize_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api_url = str(get_client(sync_client=True).api_url)
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        return api_url, serialize_context()


def _loads(blob: bytes | None) -> BaseException | None:
    try:
        return cloudpickle.loads(blob) if blob else None
    except Exception:  # a class the parent cannot rebuild: the traceback text says it all
        return None


# ------------------------------------------------------------------------------------------
# Child side
# ------------------------------------------------------------------------------------------


def _variant_main(conn: Any, payload: bytes) -> None:
    """The spawned process: the experiment subflow under the parent's flow run."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # unwinds the run: workers, lock, MLflow
    job, reports_evals, context, log_level, parent_pid = cloudpickle.loads(payload)
    _stop_with_parent(parent_pid)
    from prefect.context import hydrated_context

    from flows.experiment import experiment

    _setup_child_logging(job.name, log_level)
    on_eval = _RemoteEval(conn) if reports_evals else None
    try:
        with hydrated_context(context):
            result = experiment.with_options(flow_run_name=job.flow_run_name)(
                job.config, parent_run_id=job.parent_run_id, run_name=job.run_name, on_eval=on_eval
            )
    except BaseException as err:
        try:
            blob = cloudpickle.dumps(err)
        except Exception:
            blob = None
        conn.send(("error", blob, traceback.format_exc()))
        sys.exit(1)
    conn.send(("ok", result))


class _RemoteEval:
    """The child's ``on_eval``: asks the parent's hook, raises what it raised (a pruned trial)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __call__(self, version: int, accuracy: float) -> None:
        self.conn.send(("eval", version, accuracy))
        answer, blob = self.conn.recv()
        if answer == "raise":
            raise cloudpickle.loads(blob)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _stop_with_parent(parent_pid: int) -> None:
    """Linux: get SIGTERM when the parent dies, even by ``kill -9``, so no variant outlives it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # it died before prctl took effect
        raise SystemExit(128 + signal.SIGTERM)


def _setup_child_logging(name: str, level: int) -> None:
    """Log lines prefixed with the variant's name: several variants share one terminal."""
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s [{name}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    for noisy in ("httpx", "urllib3", "filelock", "fsspec", "botocore", "s3fs", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
