"""Typed handles on the workers in other processes: what the train loop, SFT and weight sync may
call on the rollout worker and the learner ranks.

:class:`RolloutHandle` and :class:`LearnerHandle` are Protocols with the public methods of
:class:`~core.runtime.rollout_worker.RolloutWorker` and
:class:`~core.runtime.learner_worker.LearnerWorker` (tests/core/runtime/test_handles.py checks
every signature against the worker's). :func:`typed` puts one over an
:class:`~core.runtime.actors.Actor` (a subprocess, a Ray actor or an object in this process) or
a :class:`~core.runtime.placement.LearnerGroup` (every rank; rank 0's result), so the driver
writes ``rollout.prepare_batch(timeout_s)`` and an IDE, a type checker and a reader can follow
it. This is the only place a method's name travels as a string: a name the handle does not
declare fails where it is written, before anything is sent.

A handle's own controls (``close``, and a learner group's ``wait_idle`` and ``node_ids``) run
on the actor or group itself; every other method is a call in the worker's process, blocking
until it answers, in the order made. Given a :class:`~core.runtime.watchdog.Watch`, a handle logs
what it waits for while a call runs long and gives up past the watch's limit.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from core.runtime.watchdog import Watch

if TYPE_CHECKING:  # the workers' types only: importing them here would load torch for nothing
    import torch

    from core.rollout.api import Group
    from core.training import TrainBatch


class RolloutHandle(Protocol):
    """The rollout worker (engine + staleness-bounded executor) seen from the driver."""

    def prepare_batch(self, timeout_s: float | None = None) -> list[Group]: ...

    def update_weights(self, path: str, version: int) -> float: ...

    def init_weight_group(
        self, master_address: str, master_port: int, name: str, backend: str
    ) -> None: ...

    def restore_servers(self, addresses: list[str]) -> None: ...

    def destroy_weight_group(self, name: str) -> None: ...

    def update_weights_distributed(
        self, metadata: dict[str, list], version: int, name: str
    ) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...

    def evaluate(self, samples: list[dict]) -> dict[str, Any]: ...

    def close(self) -> None:
        """Stop the worker (its rollouts, engine and servers' sessions) and its process."""


class LearnerHandle(Protocol):
    """Every learner rank at once (one FSDP2 process group); each call returns rank 0's result."""

    def compute_values(self, batch: TrainBatch) -> torch.Tensor: ...

    def compute_ref_logprobs(self, batch: TrainBatch) -> torch.Tensor: ...

    def rl_update(self, batch: TrainBatch) -> dict[str, float]: ...

    def sft_step(self, batch: TrainBatch) -> dict[str, float]: ...

    def dpo_step(self, batch: TrainBatch) -> dict[str, float]: ...

    def sequence_logprobs(self, batch: TrainBatch, reference: bool = False) -> torch.Tensor: ...

    def reward_model_step(self, batch: TrainBatch) -> dict[str, float]: ...

    def sequence_rewards(self, batch: TrainBatch) -> torch.Tensor: ...

    def export(self, directory: str) -> str: ...

    def open_weight_group(
        self, master_address: str, master_port: int, world_size: int, name: str, backend: str
    ) -> None: ...

    def weight_metadata(self) -> dict[str, list]: ...

    def broadcast_weights(self) -> None: ...

    def close_weight_group(self) -> None: ...

    def save_checkpoint(self, url: str) -> None: ...

    def load_checkpoint(self, url: str) -> int: ...

    def version(self) -> int: ...

    def node_address(self) -> str: ...

    def is_main(self) -> bool: ...

    def node_ids(self) -> list[str]:
        """The node each rank runs on, in rank order (the group asks every rank)."""

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait for the last call to finish on every rank; False if it is still running."""

    def close(self) -> None:
        """Stop every rank (and free what placed them)."""


class LearnerRank(Protocol):
    """One learner rank, for what differs between ranks."""

    def node_id(self) -> str: ...


H = TypeVar("H")


def methods(protocol: type) -> frozenset[str]:
    """The public method names ``protocol`` declares (its own and its bases', not Protocol's)."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object) or cls.__name__ == "Generic":
            continue
        names.update(n for n, v in vars(cls).items() if callable(v) and not n.startswith("_"))
    return frozenset(names)


class _Handle:
    """What :func:`typed` returns; see the module docstring."""

    __slots__ = ("_target", "_protocol", "_methods", "_watch")

    def __init__(self, target: Any, protocol: type, watch: Watch | None) -> None:
        self._target = target
        self._protocol = protocol
        self._methods = methods(protocol)
        self._watch = watch

    def __getattr__(self, name: str) -> Any:
        if name not in self._methods:
            raise AttributeError(f"{self._protocol.__name__} has no method {name!r}")
        own = getattr(type(self._target), name, None)
        if callable(own):  # a control of the actor or group itself (close, wait_idle, …)
            return getattr(self._target, name)
        if self._watch is None:
            return functools.partial(self._target.call, name)
        target, watch = self._target, self._watch

        def watched(*args: Any, **kwargs: Any) -> Any:
            return watch.wait(name, target.call_async(name, *args, **kwargs))

        return watched

    def __repr__(self) -> str:
        return f"{self._protocol.__name__}({self._target!r})"


def typed(target: Any, protocol: type[H], watch: Watch | None = None) -> H:
    """``target`` (anything with ``call(method, *args, **kwargs)``: an Actor, a LearnerGroup)
    seen through ``protocol``'s methods; with ``watch``, each call is awaited under it (the
    target's ``call_async``)."""
    return cast(H, _Handle(target, protocol, watch))
