"""A process group that carries new policy weights from the learner to inference servers.

SGLang's distributed weight update: the learner's rank 0 (group rank 0, the sender) and every
inference server (ranks 1..n) join a *new* torch process group named ``group_name``; on each
update every server receives the tensors by broadcast from rank 0, in an agreed order. Our
learner already uses the default ``torch.distributed`` group (FSDP2), so this group is built
directly from a store and a backend and never touches the default one.

The store keys follow what SGLang's ``init_custom_process_group`` gets from torch (a
``tcp://`` rendezvous whose ``TCPStore`` rank 0 hosts, then ``PrefixStore(group_name)``, then
torch's ``"{group_name}/"`` and ``"{device}/"`` prefixes, and the sequence number torch agrees
on at creation), so either side may be a group torch built that way. As in torch, one gloo
backend carries CPU and CUDA tensors alike; nccl carries CUDA tensors.

One caveat of collectives: if one side gives up (a rejected request), the others' pending
broadcasts wait for the group's timeout, unless it closes its group (:func:`close_group`): its
connections close and their broadcasts fail at once. A failed broadcast breaks the group for
good: close it on every side and open a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend as C10dBackend  # ProcessGroupGloo's base

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
BACKENDS = ("gloo", "nccl")
_STORE_DEVICE = {"gloo": "cpu", "nccl": "cuda"}  # torch names a backend's keys by its first device


@dataclass
class WeightGroup:
    """One side's membership of a weight-update group (rank 0 also hosts the store)."""

    name: str
    rank: int
    world_size: int
    backend: str
    store: TCPStore | None  # kept referenced: on rank 0 it is the server the others talk to
    process_group: C10dBackend | None  # None once closed

    @property
    def closed(self) -> bool:
        return self.process_group is None

    def backend_for_transfer(self) -> C10dBackend:
        if self.process_group is None:
            raise RuntimeError(f"weight group {self.name!r} is closed")
        return self.process_group


def check_backend(backend: str) -> None:
    """Raise ``ValueError`` unless this torch build can run ``backend``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {list(BACKENDS)}")
    if backend == "nccl" and not dist.is_nccl_available():
        raise ValueError(
            "backend 'nccl' needs a CUDA build of torch with NCCL; this process has none "
            "(use 'gloo')"
        )
    if backend == "gloo" and not dist.is_gloo_available():
        raise ValueError("backend 'gloo' is not built into this torch")


def _make_backend(
    backend: str, store: dist.Store, rank: int, world_size: int, timeout: timedelta
) -> C10dBackend:
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    from torch.distributed import ProcessGroupNCCL  # only importable in CUDA builds

    options = ProcessGroupNCCL.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    return ProcessGroupNCCL(store, rank, world_size, options)


def open_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str = "gloo",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> WeightGroup:
    """Join the group ``group_name`` as ``rank``; blocks until all ``world_size`` ranks joined.

    Rank 0 (the sender) listens on ``master_address:master_port``; the others connect to it.
    """
    check_backend(backend)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
    if not 0 < master_port < 2**16:
        raise ValueError(f"master_port {master_port} is not a TCP port")
    timeout = timedelta(seconds=timeout_s)
    store = TCPStore(
        master_address, master_port, world_size, is_master=rank == 0, timeout=timeout,
        multi_tenant=True,
    )  # fmt: skip
    group_store = PrefixStore(f"{group_name}/", PrefixStore(group_name, store))
    device_store = PrefixStore(f"{_STORE_DEVICE[backend]}/", group_store)
    process_group = _make_backend(backend, device_store, rank, world_size, timeout)
    process_group._set_sequence_number_for_group()  # torch does it; its peers wait for it
    group = WeightGroup(group_name, rank, world_size, backend, store, process_group)
    logger.info(
        "joined weight group %r as rank %d of %d (%s)", group_name, rank, world_size, backend
    )
    return group


def tensor_metadata(tensors: Mapping[str, torch.Tensor]) -> dict[str, list]:
    """SGLang's ``names``/``dtypes``/``shapes`` fields for ``tensors``, in broadcast order."""
    return {
        "names": list(tensors),
        "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
        "shapes": [list(t.shape) for t in tensors.values()],
    }


def _broadcast_all(group: WeightGroup, tensors: Iterable[torch.Tensor], src: int) -> None:
    """Start every broadcast (they run in order), then wait for all."""
    process_group = group.backend_for_transfer()
    works = [process_group.broadcast(t, src) for t in tensors]
    for work in works:
        work.wait()


def broadcast_tensors(group: WeightGroup, tensors: Iterable[torch.Tensor], src: int = 0) -> None:
    """Send ``tensors`` (rank ``src``, usually 0) to every other rank, in this order."""
    if group.rank != src:
        raise ValueError(f"rank {group.rank} is not the source rank {src}")
    _broadcast_all(group, [t.detach().contiguous() for t in tensors], src)


def receive_tensors(
    group: WeightGroup,
    names: Sequence[str],
    dtypes: Sequence[torch.dtype],
    shapes: Sequence[Sequence[int]],
    device: str | torch.device = "cpu",
    src: int = 0,
) -> dict[str, torch.Tensor]:
    """Receive one tensor per name (same order as the sender's) by broadcast from ``src``."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes")
    out = {
        name: torch.empty(tuple(shape), dtype=dtype, device=device)
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True)
    }
    _broadcast_all(group, out.values(), src)
    return out


def close_group(group: WeightGroup) -> None:
    """Leave the group (idempotent): the peers' pending and later broadcasts on it then fail."""
    # The connections close when the last reference goes, which fails the peers' pending
    # broadcasts at once (gloo's abort() does not: they would wait for the timeout).
    process_group, group.process_group, group.store = group.process_group, None, None
    if process_group is not None:
        process_group.shutdown()
    logger.info("left weight group %r (rank %d)", group.name, group.rank)
