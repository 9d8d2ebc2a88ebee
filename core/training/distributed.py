"""Process-group helpers for the learner: init from the environment, small collectives, a launcher.

The learner runs one process per rank. Everything here also works when ``torch.distributed`` is
not initialised (a single process, world size 1): the collectives then return their input.

``spawn_local`` starts ``world_size`` local ranks on 127.0.0.1 (gloo on CPU, NCCL on GPUs) and
returns each rank's result; tests and debugging use it, production launches through Ray or
``torchrun`` (both set the same environment variables that ``init_distributed`` reads).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

logger = logging.getLogger(__name__)

_Number = TypeVar("_Number", float, torch.Tensor)

_ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: its rank, the world size, and the device it should compute on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def default_device(local_rank: int = 0) -> torch.device:
    """``cuda:<local_rank>`` when a GPU is visible, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """True on rank 0 (and in a single process without a process group)."""
    return get_rank() == 0


def dist_info() -> DistInfo:
    """The current process's placement (world size 1 on the CPU/GPU 0 without a group)."""
    local_rank = int(os.environ.get("LOCAL_RANK", get_rank()))
    return DistInfo(get_rank(), get_world_size(), local_rank, default_device(local_rank))


def init_distributed(
    backend: str | None = None, *, timeout: timedelta = timedelta(minutes=10)
) -> DistInfo:
    """Join the process group described by RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

    Without those variables this is a no-op (one process, no group). The backend defaults to
    NCCL when CUDA is available and gloo otherwise; on GPUs the current device is set to
    ``cuda:LOCAL_RANK`` so collectives and the learner's tensors land on the same card.
    """
    if is_initialized():
        return dist_info()
    missing = [key for key in _ENV_KEYS if key not in os.environ]
    if missing:
        if len(missing) < len(_ENV_KEYS):
            raise ValueError(f"incomplete distributed environment: {missing} not set")
        logger.debug("no distributed environment: running as a single process")
        return dist_info()
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(default_device(local_rank))
    dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    info = dist_info()
    logger.info("rank %d/%d joined (%s, %s)", info.rank, info.world_size, backend, info.device)
    return info


def destroy_distributed() -> None:
    if is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def _all_reduce(values: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
    if not is_initialized() or get_world_size() == 1:
        return values
    # gloo reduces CPU tensors only and NCCL CUDA tensors only: follow the backend.
    device = torch.device("cpu") if dist.get_backend() == "gloo" else dist_info().device
    reduced = values.detach().to(device=device, copy=True)
    dist.all_reduce(reduced, op=op)
    return reduced.to(values.device)


def all_reduce_sum(value: _Number) -> _Number:
    """SUM over ranks; a float in gives a float out (reduced in float64)."""
    if isinstance(value, torch.Tensor):
        return _all_reduce(value, dist.ReduceOp.SUM)
    return float(_all_reduce(torch.tensor(float(value), dtype=torch.float64), dist.ReduceOp.SUM))


def all_reduce_max(value: _Number) -> _Number:
    """MAX over ranks; a float in gives a float out."""
    if isinstance(value, torch.Tensor):
        return _all_reduce(value, dist.ReduceOp.MAX)
    return float(_all_reduce(torch.tensor(float(value), dtype=torch.float64), dist.ReduceOp.MAX))


# ---------------------------------------------------------------------------------------------
# Local launcher (tests, debugging)
# ---------------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` different TCP ports on 127.0.0.1 that are free right now (the project's one helper)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in sockets:  # all bound at once, so the ports differ
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    return free_ports(1)[0]


def _rank_entry(
    rank: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    world_size: int,
    port: int,
    env: Mapping[str, str],
    num_threads: int,
    result_dir: str,
) -> None:
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    # A native crash (SIGABRT/SIGSEGV) then prints the Python stack of every thread.
    faulthandler.enable(all_threads=True)
    # Ranks share the machine's cores: without a cap each would start one thread per core.
    torch.set_num_threads(num_threads)
    path = Path(result_dir) / f"rank{rank}.pt"
    try:
        try:
            init_distributed()
            result = fn(*args)
        except BaseException:
            torch.save({"ok": False, "error": traceback.format_exc()}, path)
            raise
        torch.save({"ok": True, "result": result}, path)
        # Past this barrier every result is stored and every rank is done with its collectives,
        # so no rank closes its sockets while a peer still waits on them. It fails when a peer
        # has failed: that peer's error is the one to report, so this rank exits cleanly.
        try:
            barrier()
        except Exception as err:
            logger.warning("rank %d: final barrier failed (%s); a peer has failed", rank, err)
    finally:
        destroy_distributed()


def spawn_local(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    env: Mapping[str, str] | None = None,
    num_threads: int = 1,
    timeout_s: float = 300.0,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` fresh local ranks; return the per-rank results.

    Each rank is a spawned process with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (plus
    ``env``), ``torch.set_num_threads(num_threads)`` and an initialised process group. ``fn``
    must be importable by name (a module-level function) and return something ``torch.save``
    can store. A rank that raises makes this raise with its traceback; ranks still running
    after ``timeout_s`` (a collective deadlock) are killed and ``TimeoutError`` is raised.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="spawn_local-") as result_dir:
        context = mp.start_processes(
            _rank_entry,
            args=(fn, args, world_size, port, dict(env or {}), num_threads, result_dir),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        paths = [Path(result_dir) / f"rank{rank}.pt" for rank in range(world_size)]
        try:
            _join(context, timeout_s)
        except mp.ProcessExitedException as exc:
            # A rank that returned its result and then died in teardown (process-group or
            # interpreter shutdown) did the work: keep the results, say what happened.
            if exc.exit_code >= 0 or not all(_finished_ok(path) for path in paths):
                raise
            logger.warning(
                "spawn_local: rank %d died with %s after every rank stored its result",
                exc.error_index,
                exc.signal_name,
            )
        return [_read_result(path, rank) for rank, path in enumerate(paths)]


def _join(context: mp.ProcessContext, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"spawn_local: ranks still running after {timeout_s:.0f} s")
    finally:
        # Only the processes started above; join() already reaped finished ones.
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)


def _finished_ok(path: Path) -> bool:
    try:
        return bool(torch.load(path, map_location="cpu", weights_only=False)["ok"])
    except Exception:  # missing or half-written: the rank died before its result was stored
        return False


def _read_result(path: Path, rank: int) -> Any:
    if not path.exists():
        raise RuntimeError(f"rank {rank} exited without a result")
    # CPU: a GPU rank's tensors must load in a parent that may have no GPU.
    record = torch.load(path, map_location="cpu", weights_only=False)
    if not record["ok"]:
        raise RuntimeError(f"rank {rank} failed:\n{record['error']}")
    return record["result"]
