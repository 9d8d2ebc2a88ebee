"""Strict parsing of the engine server's request bodies: every field typed and range-checked.

Nothing reaches the engine before it has passed these checks, so one bad request can neither
fail the other requests decoded in its batch nor poison the model (on CUDA an out-of-range
embedding index is a device-side assert that breaks the whole process, not one request).

Rules (each violation raises :class:`RequestError` naming the field; the server answers 400):

- The body is a JSON object (``NaN``/``Infinity`` literals, invalid UTF-8, nesting that overflows
  the parser and integers too long to parse are rejected too). Unknown fields are rejected rather
  than silently ignored: an ignored sampling field would make the behaviour policy differ from
  what the caller believes it sampled from.
- ``/generate`` (``input_ids``, ``sampling_params`` and SGLang's other fields) is checked in
  :mod:`core.inference.server.sglang_params`: token ids are JSON integers (not a float such as ``5.0``,
  not a bool, not a string) in ``[0, vocab_size)``; a prompt leaves room for one token in the
  context; ``max_new_tokens`` is capped by the context left after the prompt and the server's
  ``max_new_tokens_cap``; SGLang's sampling fields are range-checked as SGLang checks them.
- ``/pause_generation``: ``mode`` one of abort/retract/in_place. ``/update_weights_from_disk``:
  ``model_path`` a non-empty string, ``abort_all_requests`` a boolean, ``weight_version`` an
  integer or a string of digits in ``[0, MAX_WEIGHT_VERSION]`` (or null = current + 1). Where the
  path may point and which versions are accepted depends on server state (see
  :mod:`core.inference.server`).
- Distributed weight update: ``rank_offset`` in ``[1, world_size)`` (rank 0 sends), ``backend``
  gloo or nccl, ``group_name`` letters, digits and ``_.:-``; ``names`` distinct, with one
  ``dtypes`` name (``WEIGHT_DTYPES``) and one ``shapes`` list each; ``load_format`` null. Whether
  they fit the model is checked in :mod:`core.inference.server.weight_sync_endpoints`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from core.inference.api import DEFAULT_GROUP_NAME
from core.inference.engine.sampling import is_int

MAX_WEIGHT_VERSION = 2**31 - 1  # one version per optimizer step: anything above is a bug
MAX_PATH_CHARS = 4096

PAUSE_FIELDS = frozenset({"mode"})
PAUSE_MODES = {"abort": "abort", "retract": "retract", "in_place": "retract"}
# Our engine re-prefills a retracted request, which is what SGLang's "in_place" amounts to.
UPDATE_FIELDS = frozenset({"model_path", "abort_all_requests", "weight_version", "reset_version"})
GROUP_INIT_FIELDS = frozenset(
    {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
)
DISTRIBUTED_UPDATE_FIELDS = frozenset(
    {"names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests",
     "weight_version", "load_format"}
)  # fmt: skip
GROUP_DESTROY_FIELDS = frozenset({"group_name"})
GROUP_BACKENDS = ("gloo", "nccl")
WEIGHT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
MAX_GROUP_SIZE = 4096
MAX_TENSORS = 100_000  # names in one update
MAX_DIMS = 8
_DIGITS = re.compile(r"[0-9]{1,10}")
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_HOST = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,255}")


class RequestError(ValueError):
    """A request the server refuses; ``status`` is its HTTP status, ``field`` what was wrong."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.status = status


@dataclass(frozen=True)
class RequestLimits:
    """What a request may ask of this server's model."""

    vocab_size: int
    context_length: int | None = None  # max_position_embeddings; None = unknown
    max_new_tokens_cap: int | None = None  # the server's own cap, on top of the context's
    max_prompts: int = 1024  # prompts in one batched /generate
    max_stop_ids: int = 1024
    max_rid_chars: int = 256
    stop_strings: bool = False  # the engine has a tokenizer: stop strings, output text
    max_messages: int = 4096  # messages in one chat completion
    # Characters a chat completion's messages and tools may hold, checked before rendering and
    # tokenising (which would otherwise hold the server for as long as a huge body takes).
    # None: 32 per token of the context (a token seldom spans more), else 4 million.
    max_chat_chars: int | None = None

    def chat_chars(self) -> int:
        """The character limit of a chat completion's messages and tools."""
        if self.max_chat_chars is not None:
            return self.max_chat_chars
        return 32 * self.context_length if self.context_length else 4_000_000

    def room(self, n_prompt: int) -> int | None:
        """The most new tokens a prompt of ``n_prompt`` tokens may ask for (None = no limit)."""
        caps = [c for c in (self.max_new_tokens_cap,) if c is not None]
        if self.context_length is not None:
            caps.append(self.context_length - n_prompt)
        return min(caps) if caps else None


@dataclass
class WeightUpdate:
    """A validated ``/update_weights_from_disk`` body."""

    model_path: str
    abort_all_requests: bool
    weight_version: int | None
    reset_version: bool = False  # our extension: any weight_version (a run starts or resumes)


@dataclass(frozen=True)
class GroupInit:
    """A validated ``/init_weights_update_group`` body (this server joins as ``rank_offset``)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str


@dataclass(frozen=True)
class DistributedUpdate:
    """A validated ``/update_weights_from_distributed`` body (tensors in broadcast order)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str
    abort_all_requests: bool
    weight_version: int | None


# ---------------------------------------------------------------------- JSON and primitives


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(raw: bytes) -> Any:
    """Decode a request body; any malformation becomes a :class:`RequestError` on ``body``."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError("body", f"not valid JSON ({_short(exc)})") from None


def _short(exc: BaseException, limit: int = 160) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _kind(value: Any) -> str:
    """A value's JSON type name, for error messages (never the value itself: it may be huge)."""
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)  # fmt: skip


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(field, f"must be a JSON object, got {_kind(value)}")
    return value


def _no_unknown(body: dict[str, Any], known: frozenset[str], field: str) -> None:
    unknown = sorted(str(k)[:40] for k in body if k not in known)
    if unknown:
        raise RequestError(
            f"{field}.{unknown[0]}" if field else unknown[0],
            f"unknown field(s) {unknown[:5]}; supported: {sorted(known)}",
        )


def _optional_bool(value: Any, field: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(field, f"must be a boolean, got {_kind(value)}")
    return value


def _int_in(value: Any, field: str, low: int, high: int | None) -> int:
    if not is_int(value):
        raise RequestError(field, f"must be an integer, got {_kind(value)}")
    if value < low or (high is not None and value > high):
        top = "" if high is None else f", {high}"
        shown = value if abs(value) < 10**30 else "a huge integer"
        raise RequestError(field, f"{shown} is out of range [{low}{top or ', ...'}]")
    return value


def _finite(value: Any, field: str) -> float:
    if not (is_int(value) or isinstance(value, float)):
        raise RequestError(field, f"must be a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        raise RequestError(field, "must be a finite number") from None
    if not math.isfinite(number):
        raise RequestError(field, f"must be a finite number, got {number}")
    return number


def token_ids(value: Any, field: str, vocab_size: int, *, allow_empty: bool = False) -> list[int]:
    """A list of integer token ids in ``[0, vocab_size)``."""
    if not isinstance(value, list):
        raise RequestError(field, f"must be a list of token ids, got {_kind(value)}")
    if not value and not allow_empty:
        raise RequestError(field, "must not be empty")
    for i, token in enumerate(value):
        if not is_int(token):
            raise RequestError(f"{field}[{i}]", f"token ids are integers, got {_kind(token)}")
        if not 0 <= token < vocab_size:
            shown = token if abs(token) < 10**30 else "a huge integer"
            raise RequestError(
                f"{field}[{i}]", f"{shown} is outside the vocabulary [0, {vocab_size})"
            )
    return value


# ---------------------------------------------------------------------- admin endpoints


def parse_pause(body: Any) -> str:
    """A ``/pause_generation`` body (``{}`` when absent) -> the engine's pause mode."""
    body = _object(body, "body")
    _no_unknown(body, PAUSE_FIELDS, "")
    mode = body.get("mode", "abort")
    if not isinstance(mode, str) or mode not in PAUSE_MODES:
        raise RequestError("mode", f"must be one of {sorted(PAUSE_MODES)}")
    return PAUSE_MODES[mode]


def parse_weight_version(value: Any) -> int | None:
    """SGLang sends versions as strings; ours are integers: accept both, nothing else."""
    if value is None:
        return None
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise RequestError(
                "weight_version", f"{value[:40]!r}: this server uses non-negative integer versions"
            )
        value = int(value)
    return _int_in(value, "weight_version", 0, MAX_WEIGHT_VERSION)


def parse_update(body: Any) -> WeightUpdate:
    """A ``/update_weights_from_disk`` body -> path, abort flag, requested version."""
    body = _object(body, "body")
    _no_unknown(body, UPDATE_FIELDS, "")
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        raise RequestError("model_path", f"must be a non-empty string, got {_kind(path)}")
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise RequestError("model_path", "is not a usable path")
    return WeightUpdate(
        model_path=path,
        abort_all_requests=_optional_bool(
            body.get("abort_all_requests"), "abort_all_requests", False
        ),
        weight_version=parse_weight_version(body.get("weight_version")),
        reset_version=_optional_bool(body.get("reset_version"), "reset_version", False),
    )


# ---------------------------------------------------------------------- distributed weight update


def _group_name(body: dict[str, Any]) -> str:
    name = body.get("group_name", DEFAULT_GROUP_NAME)
    if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
        raise RequestError("group_name", "must be 1-128 letters, digits or _ . : -")
    return name


def parse_group_init(body: Any) -> GroupInit:
    """An ``/init_weights_update_group`` body -> where to join which group as which rank."""
    body = _object(body, "body")
    _no_unknown(body, GROUP_INIT_FIELDS, "")
    address = body.get("master_address")
    if not isinstance(address, str) or not _HOST.fullmatch(address):
        raise RequestError("master_address", "must be a host name or IP address")
    world_size = _int_in(body.get("world_size"), "world_size", 2, MAX_GROUP_SIZE)
    backend = body.get("backend", "nccl")  # SGLang's default
    if backend not in GROUP_BACKENDS:
        raise RequestError("backend", f"must be one of {list(GROUP_BACKENDS)}")
    return GroupInit(
        master_address=address,
        master_port=_int_in(body.get("master_port"), "master_port", 1, 65535),
        rank_offset=_int_in(body.get("rank_offset"), "rank_offset", 1, world_size - 1),
        world_size=world_size,
        group_name=_group_name(body),
        backend=backend,
    )


def _shape(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_DIMS:
        raise RequestError(field, f"must be a list of at most {MAX_DIMS} dimensions")
    return [_int_in(d, f"{field}[{i}]", 0, 2**40) for i, d in enumerate(value)]


def _tensor_names(value: Any) -> list[str]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_TENSORS:
        raise RequestError("names", f"must be a list of 1 to {MAX_TENSORS} tensor names")
    seen: set[str] = set()
    for i, name in enumerate(value):
        if not isinstance(name, str) or not 0 < len(name) <= 1024:
            raise RequestError(f"names[{i}]", "must be a non-empty string of at most 1024 chars")
        if name in seen:
            raise RequestError(f"names[{i}]", f"{name!r} is given twice")
        seen.add(name)
    return value


def parse_distributed_update(body: Any) -> DistributedUpdate:
    """An ``/update_weights_from_distributed`` body -> the tensors to receive, in order."""
    body = _object(body, "body")
    _no_unknown(body, DISTRIBUTED_UPDATE_FIELDS, "")
    names = _tensor_names(body.get("names"))
    for field in ("dtypes", "shapes"):
        value = body.get(field)
        if not isinstance(value, list) or len(value) != len(names):
            raise RequestError(field, f"must be a list with one entry per name ({len(names)})")
    for i, dtype in enumerate(body["dtypes"]):
        if not isinstance(dtype, str) or dtype not in WEIGHT_DTYPES:
            raise RequestError(f"dtypes[{i}]", f"must be one of {sorted(WEIGHT_DTYPES)}")
    if body.get("load_format") is not None:
        raise RequestError("load_format", "only null (plain tensors) is supported")
    _optional_bool(body.get("flush_cache"), "flush_cache", True)  # a load always flushes here
    return DistributedUpdate(
        names=names,
        dtypes=body["dtypes"],
        shapes=[_shape(s, f"shapes[{i}]") for i, s in enumerate(body["shapes"])],
        group_name=_group_name(body),
        abort_all_requests=_optional_bool(
            body.get("abort_all_requests"), "abort_all_requests", False
        ),
        weight_version=parse_weight_version(body.get("weight_version")),
    )


def parse_group_destroy(body: Any) -> str:
    """A ``/destroy_weights_update_group`` body -> the group's name."""
    body = _object(body, "body")
    _no_unknown(body, GROUP_DESTROY_FIELDS, "")
    return _group_name(body)
