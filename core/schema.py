"""The one way a config field is declared: a default, the help text ``asyncrl config docs``
shows, and the values it allows.

Every config dataclass (``core.config``, ``core.algorithms.config``, ``core.data.synthetic``)
declares its fields with :func:`documented`, after TRL's configs: the help lives beside the
field, docs/config.md is generated from it, and a bound (``gt``/``ge``/``le``) or ``choices``
given there is checked by :func:`bound_problems` when the config loads, naming the key.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import MISSING, field
from typing import Any


def documented(
    default: Any = MISSING,
    help: str = "",
    *,
    factory: Any = MISSING,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    choices: Sequence[str] | None = None,
) -> Any:
    """A dataclass field with ``help`` and its allowed values in its metadata: ``gt``/``ge``
    (exclusive/inclusive lower bound), ``le`` (inclusive upper bound), ``choices``. ``None``
    always passes the bounds (for optional fields).

    Mutable defaults (lists, dicts) are copied per instance; a nested section passes its
    dataclass as ``factory``.
    """
    bounds = {"gt": gt, "ge": ge, "le": le, "choices": tuple(choices) if choices else None}
    metadata = {"help": help, "bounds": {k: v for k, v in bounds.items() if v is not None}}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def describe_bounds(bounds: dict[str, Any]) -> str:
    """``"> 0"``, ``">= 0"``, ``"in [0, 1]"``, ``"one of ['a', 'b']"`` (empty when unbounded)."""
    if "choices" in bounds:
        return f"one of {list(bounds['choices'])}"
    low = "gt" if "gt" in bounds else "ge" if "ge" in bounds else None
    if low and "le" in bounds:
        return f"in {'(' if low == 'gt' else '['}{bounds[low]}, {bounds['le']}]"
    if low:
        return f"{'>' if low == 'gt' else '>='} {bounds[low]}"
    return f"<= {bounds['le']}" if "le" in bounds else ""


def within(value: Any, bounds: dict[str, Any]) -> bool:
    """Whether ``value`` is allowed by ``bounds`` (``None`` always is; so is a NaN or infinite
    float, which the config's finiteness check names instead)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return True
    if "choices" in bounds:
        return value in bounds["choices"]
    return not (
        ("gt" in bounds and not value > bounds["gt"])
        or ("ge" in bounds and not value >= bounds["ge"])
        or ("le" in bounds and not value <= bounds["le"])
    )


def bound_problems(node: Any, prefix: str = "") -> Iterator[str]:
    """One message per field of the dataclass ``node`` (and its nested sections) outside what
    its declaration allows: ``"rollout.batch_size must be > 0, got 0"``."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from bound_problems(value, f"{key}.")
            continue
        bounds = f.metadata.get("bounds", {})
        if bounds and not within(value, bounds):
            if "choices" in bounds:
                yield f"{key}={value!r} is not {describe_bounds(bounds)}"
            else:
                yield f"{key} must be {describe_bounds(bounds)}, got {value}"
