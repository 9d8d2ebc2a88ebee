"""SGLang's distributed weight update on our server (routes added by :mod:`core.inference.server`).

- ``POST /init_weights_update_group`` ``{"master_address", "master_port", "rank_offset",
  "world_size", "group_name", "backend"}``: join the process group ``group_name`` as rank
  ``rank_offset`` (one model process here, so no tensor-parallel ranks on top); rank 0, the
  learner, hosts the store at ``master_address:master_port``. The join blocks until every rank
  has joined; it runs on a worker thread, so the server keeps answering meanwhile.
- ``POST /update_weights_from_distributed`` ``{"names", "dtypes", "shapes", "group_name",
  "flush_cache", "abort_all_requests", "weight_version", "load_format"}``: pause (abort or drain
  in-flight requests), receive every tensor by broadcast from rank 0 in the order given, load
  them, stamp ``weight_version`` (rules as ``/update_weights_from_disk``'s; null = current + 1),
  resume if we paused. Names and shapes are checked against the served model before anything
  is received: one update carries the whole state dict (a tied ``lm_head`` may be left out).
  Everything is received before anything is loaded, so a failed transfer leaves the model as it
  was; it also closes the group (its connections are broken): init a new one.
- ``POST /destroy_weights_update_group`` ``{"group_name"}``: leave the group.

Each answers ``{"success", "message"}`` (a failure also carries ``error.message`` and a 4xx).
The sender side is :mod:`core.inference.weight_broadcast`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from aiohttp import web
from torch import nn

from core.inference.api import WeightSource
from core.inference.engine.hf_engine import HFEngine
from core.inference.engine.weights import complete_tied_weights
from core.inference.server.guard import next_version
from core.inference.server.validation import (
    DistributedUpdate,
    RequestError,
    loads,
    parse_distributed_update,
    parse_group_destroy,
    parse_group_init,
)
from core.inference.weight_broadcast import (
    DEFAULT_TIMEOUT_S,
    WeightGroup,
    check_backend,
    close_group,
    open_group,
    receive_tensors,
)

logger = logging.getLogger(__name__)

INLINE_PARSE_BYTES = 256 * 1024  # larger bodies (long name lists) are parsed on a worker thread
T = TypeVar("T")


@dataclass
class WeightSync:
    """The server's weight groups, and what an update needs from the rest of the server."""

    engine: HFEngine
    state: dict[str, Any]  # the server's: "update_lock" (disk updates too), "weights_path"
    timeout_s: float = DEFAULT_TIMEOUT_S
    groups: dict[str, WeightGroup] = field(default_factory=dict)
    joining: set[str] = field(default_factory=set)


SYNC_KEY = web.AppKey("weight_sync", WeightSync)


def add_weight_sync_routes(
    app: web.Application,
    engine: HFEngine,
    state: dict[str, Any],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Serve the three endpoints on ``app``; its groups are closed on cleanup."""
    app[SYNC_KEY] = WeightSync(engine, state, timeout_s)
    app.router.add_post("/init_weights_update_group", init_weights_update_group)
    app.router.add_post("/update_weights_from_distributed", update_weights_from_distributed)
    app.router.add_post("/destroy_weights_update_group", destroy_weights_update_group)
    app.on_cleanup.append(_close_groups)


async def _close_groups(app: web.Application) -> None:
    sync = app[SYNC_KEY]
    for group in sync.groups.values():
        close_group(group)
    sync.groups.clear()


def _answer(message: str, status: int = 200) -> web.Response:
    if status < 400:
        return web.json_response({"success": True, "message": message})
    body = {"success": False, "message": message, "error": {"message": message}}
    return web.json_response(body, status=status)


async def _read(request: web.Request, parser: Callable[[Any], T]) -> T:
    raw = await request.read()
    if len(raw) <= INLINE_PARSE_BYTES:
        return parser(loads(raw))
    return await asyncio.to_thread(lambda: parser(loads(raw)))


def _group(sync: WeightSync, name: str) -> WeightGroup:
    if name not in sync.groups:
        raise RequestError(
            "group_name", f"no weight group {name!r}: POST /init_weights_update_group first"
        )
    return sync.groups[name]


def check_fits_model(model: nn.Module, names: Sequence[str], shapes: Sequence[list[int]]) -> None:
    """The update names every tensor of ``model``'s state dict once, each with its shape."""
    expected = model.state_dict()
    for i, (name, shape) in enumerate(zip(names, shapes, strict=True)):
        if name not in expected:
            raise RequestError(f"names[{i}]", f"{name[:200]!r} is not in the served model")
        if tuple(shape) != tuple(expected[name].shape):
            raise RequestError(
                f"shapes[{i}]", f"{shape} for {name!r}; the model has {list(expected[name].shape)}"
            )
    given = {name: expected[name] for name in names}  # stand-ins: only the keys matter here
    missing = sorted(set(expected) - set(complete_tied_weights(model, given)))
    if missing:
        raise RequestError(
            "names",
            f"{len(missing)} of the model's tensors are missing (e.g. {missing[:3]}): "
            "an update carries the whole state dict",
        )


# ---------------------------------------------------------------------- handlers


async def init_weights_update_group(request: web.Request) -> web.Response:
    sync = request.app[SYNC_KEY]
    try:
        init = await _read(request, parse_group_init)
        try:
            check_backend(init.backend)
        except ValueError as exc:
            raise RequestError("backend", str(exc)) from None
        if init.group_name in sync.groups or init.group_name in sync.joining:
            raise RequestError(
                "group_name", f"{init.group_name!r} exists: destroy it first", status=409
            )
    except RequestError as exc:
        return _answer(str(exc), exc.status)
    sync.joining.add(init.group_name)
    try:
        group = await asyncio.to_thread(
            open_group, init.master_address, init.master_port, init.rank_offset,
            init.world_size, init.group_name, init.backend, sync.timeout_s,
        )  # fmt: skip
    except (RuntimeError, ValueError, OSError) as exc:  # a timeout is a DistStoreError
        logger.warning("joining weight group %r failed: %s", init.group_name, exc)
        return _answer(f"Failed to init group {init.group_name!r}: {exc}", 400)
    finally:
        sync.joining.discard(init.group_name)
    sync.groups[init.group_name] = group
    return _answer(f"Joined weight group {init.group_name!r} as rank {init.rank_offset}.")


async def update_weights_from_distributed(request: web.Request) -> web.Response:
    """Like ``/update_weights_from_disk``, with the tensors coming from rank 0's broadcast."""
    sync = request.app[SYNC_KEY]
    engine = sync.engine
    try:
        update = await _read(request, parse_distributed_update)
        group = _group(sync, update.group_name)
        check_fits_model(engine.model, update.names, update.shapes)
    except RequestError as exc:
        return _answer(str(exc), exc.status)
    async with sync.state["update_lock"]:
        try:
            # A distinct "path": an equal version is never a retry of the served folder here.
            version = next_version(engine.version, update.weight_version, "<distributed>", None)
            await _receive_and_load(sync, group, update, version)
        except RequestError as exc:
            return _answer(str(exc), exc.status)
        except (RuntimeError, ValueError) as exc:
            logger.warning("weight update over group %r failed: %s", group.name, exc)
            return _answer(f"Failed to update weights: {exc}", 400)
        sync.state["weights_path"] = None  # no folder holds what is served now
    return _answer(f"Succeeded to update model weights (version {version}).")


async def _receive_and_load(
    sync: WeightSync, group: WeightGroup, update: DistributedUpdate, version: int
) -> None:
    engine = sync.engine
    dtypes = [getattr(torch, name) for name in update.dtypes]
    device = "cpu" if group.backend == "gloo" else engine.device  # gloo: CPU tensors
    paused_here = not engine.paused
    if paused_here:
        await engine.pause("abort" if update.abort_all_requests else "drain")
    try:
        try:
            state = await asyncio.to_thread(
                receive_tensors, group, update.names, dtypes, update.shapes, device
            )
        except RuntimeError:
            # A broken transfer leaves the group unusable (gloo closes its connections).
            sync.groups.pop(group.name, None)
            close_group(group)
            raise
        await engine.update_weights(WeightSource(state_dict=state), version)
    finally:
        if paused_here:
            await engine.resume()


async def destroy_weights_update_group(request: web.Request) -> web.Response:
    sync = request.app[SYNC_KEY]
    try:
        name = await _read(request, parse_group_destroy)
        _group(sync, name)
    except RequestError as exc:
        return _answer(str(exc), exc.status)
    async with sync.state["update_lock"]:  # not while an update receives over it
        group = sync.groups.pop(name, None)
        if group is not None:
            close_group(group)
    return _answer(f"Destroyed weight group {name!r}.")
