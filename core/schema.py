"""The one way a config field is declared: a default and the help text ``asyncrl config docs`` shows.

Every config dataclass (``core.config``, ``core.algorithms.config``, ``core.data.synthetic``)
declares its fields with :func:`documented`, after TRL's configs: the help lives beside the
field, and docs/config.md is generated from it.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, field
from typing import Any


def documented(default: Any = MISSING, help: str = "", *, factory: Any = MISSING) -> Any:
    """A dataclass field with ``help`` in its metadata.

    Mutable defaults (lists, dicts) are copied per instance; a nested section passes its
    dataclass as ``factory``.
    """
    metadata = {"help": help}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)
