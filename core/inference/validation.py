"""Strict parsing of the engine server's request bodies: every field typed and range-checked.

Nothing reaches the engine before it has passed these checks, so one bad request can neither
fail the other requests decoded in its batch nor poison the model (on CUDA an out-of-range
embedding index is a device-side assert that breaks the whole process, not one request).

Rules (each violation raises :class:`RequestError` naming the field; the server answers 400):

- The body is a JSON object (``NaN``/``Infinity`` literals, invalid UTF-8, nesting that overflows
  the parser and integers too long to parse are rejected too). Unknown fields are rejected rather
  than silently ignored: an ignored sampling field would make the behaviour policy differ from
  what the caller believes it sampled from.
- ``input_ids``: a non-empty list of token ids, or a non-empty list of such lists (a batch of at
  most ``max_prompts``). A token id is a JSON integer (not a float such as ``5.0``, not a bool,
  not a string) in ``[0, vocab_size)``; a prompt leaves room for one token in the context.
- ``sampling_params``: an object (or null; for a batch also a list of one object per prompt):
  ``max_new_tokens`` an integer in ``[0, cap]`` where the cap is the context left after the prompt
  (``max_position_embeddings - len(prompt)``) and, if the server sets one, its
  ``max_new_tokens_cap``; the default (128, SGLang's) is lowered to the cap instead of failing.
  ``temperature`` a finite number, 0 (greedy) or in ``[1e-6, 1e4]``; ``top_p`` in ``(0, 1]``;
  ``top_k`` an integer >= -1 (-1 and 0 = off); ``stop_token_ids`` at most ``max_stop_ids`` token
  ids; ``sampling_seed`` an integer or null; ``stop`` a string or up to 16 non-empty strings,
  only when the served model folder has a tokenizer (``no_stop_trim`` is accepted: the output
  always keeps the string's tokens).
- ``rid`` a string of at most ``max_rid_chars`` or null (for a batch also a list of them);
  ``return_logprob`` and ``stream`` booleans (``stream`` must be false).
- ``/pause_generation``: ``mode`` one of abort/retract/in_place. ``/update_weights_from_disk``:
  ``model_path`` a non-empty string, ``abort_all_requests`` a boolean, ``weight_version`` an
  integer or a string of digits in ``[0, MAX_WEIGHT_VERSION]`` (or null = current + 1). Where the
  path may point and which versions are accepted depends on server state (see
  :mod:`core.inference.server`).
- Distributed weight update: ``rank_offset`` in ``[1, world_size)`` (rank 0 sends), ``backend``
  gloo or nccl, ``group_name`` letters, digits and ``_.:-``; ``names`` distinct, with one
  ``dtypes`` name (``WEIGHT_DTYPES``) and one ``shapes`` list each; ``load_format`` null. Whether
  they fit the model is checked in :mod:`core.inference.weight_sync_endpoints`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from core.inference.api import SamplingParams
from core.inference.sampling import is_int
from core.inference.stop_strings import stop_string_problems

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when a request does not say
MIN_TEMPERATURE = 1e-6  # below this (and above 0) the scaled logits overflow float32
MAX_TEMPERATURE = 1e4
MAX_WEIGHT_VERSION = 2**31 - 1  # one version per optimizer step: anything above is a bug
MAX_PATH_CHARS = 4096

SAMPLING_FIELDS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_token_ids",
        "sampling_seed",
        "stop",
        "no_stop_trim",
    }
)
GENERATE_FIELDS = frozenset(
    {"input_ids", "sampling_params", "return_logprob", "rid", "stream", "priority"}
)
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
DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's
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
    stop_strings: bool = False  # the engine matches stop strings (it has a tokenizer)

    def room(self, n_prompt: int) -> int | None:
        """The most new tokens a prompt of ``n_prompt`` tokens may ask for (None = no limit)."""
        caps = [c for c in (self.max_new_tokens_cap,) if c is not None]
        if self.context_length is not None:
            caps.append(self.context_length - n_prompt)
        return min(caps) if caps else None


@dataclass
class GenerateBatch:
    """A validated ``/generate`` body: one entry per prompt."""

    prompts: list[list[int]]
    samplings: list[SamplingParams]
    rids: list[str | None]
    return_logprob: bool
    batched: bool  # input_ids was a list of prompts: answer with a list
    priorities: list[int]  # SGLang's "priority" per prompt (0 when not given)


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


# ---------------------------------------------------------------------- /generate


def parse_sampling(raw: Any, n_prompt: int, limits: RequestLimits, field: str) -> SamplingParams:
    """SGLang ``sampling_params`` -> ours (SGLang's ``top_k=-1`` means off, as our 0 does)."""
    raw = {} if raw is None else _object(raw, field)
    _no_unknown(raw, SAMPLING_FIELDS, field)
    stop = raw.get("stop")
    stop = [] if stop in (None, "", []) else [stop] if isinstance(stop, str) else stop
    if not isinstance(raw.get("no_stop_trim", False), bool):
        raise RequestError(
            f"{field}.no_stop_trim", f"must be a boolean, got {_kind(raw['no_stop_trim'])}"
        )
    if stop and not limits.stop_strings:
        raise RequestError(f"{field}.stop", "stop strings need a tokenizer; use stop_token_ids")
    if not isinstance(stop, list):
        raise RequestError(
            f"{field}.stop", f"must be a string or a list of strings, got {_kind(stop)}"
        )
    if problems := stop_string_problems(stop, f"{field}.stop"):
        raise RequestError(f"{field}.stop", problems[0].split(": ", 1)[-1])
    room = limits.room(n_prompt)
    if raw.get("max_new_tokens") is None:
        max_new = DEFAULT_MAX_NEW_TOKENS if room is None else min(DEFAULT_MAX_NEW_TOKENS, room)
    else:
        max_new = _int_in(raw["max_new_tokens"], f"{field}.max_new_tokens", 0, room)
    temperature = _finite(raw.get("temperature", 1.0), f"{field}.temperature")
    if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise RequestError(
            f"{field}.temperature",
            f"{temperature} must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]",
        )
    top_p = _finite(raw.get("top_p", 1.0), f"{field}.top_p")
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"{field}.top_p", f"{top_p} must be in (0, 1]")
    top_k = _int_in(raw.get("top_k", -1), f"{field}.top_k", -1, None)
    stop_ids = raw.get("stop_token_ids") or []
    stop_ids = token_ids(stop_ids, f"{field}.stop_token_ids", limits.vocab_size, allow_empty=True)
    if len(stop_ids) > limits.max_stop_ids:
        raise RequestError(f"{field}.stop_token_ids", f"at most {limits.max_stop_ids} ids")
    seed = raw.get("sampling_seed")
    if seed is not None and not is_int(seed):
        # No coercion: "7" or 7.5 would silently become another seed than the caller meant.
        raise RequestError(f"{field}.sampling_seed", f"must be an integer, got {_kind(seed)}")
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        stop_token_ids=list(stop_ids),
        stop=list(stop),
        seed=seed,
    )


def _prompts(value: Any, limits: RequestLimits) -> tuple[list[list[int]], bool]:
    """``input_ids`` -> (prompts, batched)."""
    if value is None:
        raise RequestError(
            "input_ids", "required: this server has no tokenizer (skip_tokenizer_init)"
        )
    if not isinstance(value, list):
        raise RequestError("input_ids", f"must be a list of token ids, got {_kind(value)}")
    if not value:
        raise RequestError("input_ids", "must not be empty")
    if not any(isinstance(v, list) for v in value):
        return [_prompt(value, "input_ids", limits)], False
    if len(value) > limits.max_prompts:
        raise RequestError("input_ids", f"{len(value)} prompts: at most {limits.max_prompts}")
    return [_prompt(p, f"input_ids[{i}]", limits) for i, p in enumerate(value)], True


def _prompt(value: Any, field: str, limits: RequestLimits) -> list[int]:
    ids = token_ids(value, field, limits.vocab_size)
    if limits.context_length is not None and len(ids) >= limits.context_length:
        raise RequestError(field, f"{len(ids)} tokens: the context holds {limits.context_length}")
    return ids


def _per_prompt(value: Any, n: int, batched: bool, field: str) -> list[Any]:
    """A field given once for all prompts, or (batch only) as a list of one per prompt."""
    if batched and isinstance(value, list):
        if len(value) != n:
            raise RequestError(field, f"has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def _rids(value: Any, n: int, batched: bool, limits: RequestLimits) -> list[str | None]:
    rids = _per_prompt(value, n, batched, "rid")
    for rid in rids:
        if rid is not None and not isinstance(rid, str):
            raise RequestError("rid", f"must be a string or null, got {_kind(rid)}")
        if rid is not None and len(rid) > limits.max_rid_chars:
            raise RequestError("rid", f"at most {limits.max_rid_chars} characters")
    if batched and isinstance(value, str):  # one rid for the batch: number its prompts
        return [f"{value}_{i}" for i in range(n)]
    return rids


def parse_generate(body: Any, limits: RequestLimits) -> GenerateBatch:
    """A ``/generate`` body -> validated prompts and sampling parameters."""
    body = _object(body, "body")
    if "text" in body:
        raise RequestError(
            "text", "this server has no tokenizer (skip_tokenizer_init): send input_ids"
        )
    _no_unknown(body, GENERATE_FIELDS, "")
    if _optional_bool(body.get("stream"), "stream", False):
        raise RequestError("stream", "streaming is not supported")
    prompts, batched = _prompts(body.get("input_ids"), limits)
    n = len(prompts)
    raw_sampling = _per_prompt(body.get("sampling_params"), n, batched, "sampling_params")
    samplings = [
        parse_sampling(s, len(p), limits, f"sampling_params[{i}]" if batched else "sampling_params")
        for i, (s, p) in enumerate(zip(raw_sampling, prompts, strict=True))
    ]
    return GenerateBatch(
        prompts=prompts,
        samplings=samplings,
        rids=_rids(body.get("rid"), n, batched, limits),
        return_logprob=_optional_bool(body.get("return_logprob"), "return_logprob", False),
        batched=batched,
        priorities=_priorities(body.get("priority"), n, batched),
    )


def _priorities(value: Any, n: int, batched: bool) -> list[int]:
    if value is None:
        return [0] * n
    priorities = _per_prompt(value, n, batched, "priority")
    for p in priorities:
        if isinstance(p, bool) or not isinstance(p, int) or abs(p) >= 2**63:
            raise RequestError("priority", f"must be a 64-bit integer, got {_kind(p)}")
    return priorities


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
