"""Plug-ins by import path (``"package.module:attribute"``): reward functions, workflows, and
the registries of named ones (advantage estimators, policy losses, data sources).

Configs name their plug-ins as strings, which keeps them plain data and lets workers on other
machines resolve the same objects; this is the one place that turns such a string into the
object, with an error that names the path and what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
E = TypeVar("E")

# Modules moved since earlier releases: a config (or a run's saved config.yaml) that names the old
# module still loads, with a warning naming the new one. Python imports of the old names do not.
MOVED: dict[str, str] = {
    "core.rollout.rlvr": "core.workflows.rlvr",
    "core.rollout.agent": "core.workflows.tagged_tools",
    "core.rollout.tools": "core.workflows.tools",
    "core.agents.workflow": "core.workflows.openai_agent",
    **{f"core.agents.{name}": f"core.workflows.{name}" for name in (
        "openai_client", "tool_loop", "latency", "examples", "search_env", "search_agent")},
    "core.data.search_synthetic": "core.workflows.search_data",
}  # fmt: skip

_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def load_object(path: str, what: str = "plug-in") -> object:
    """The object named by ``"module.sub:attribute"`` (the attribute may be dotted).

    Raises ValueError naming ``what`` and ``path`` when the format is wrong or the module or
    attribute is missing.
    """
    if not isinstance(path, str) or _PATH.fullmatch(path.strip()) is None:
        raise ValueError(f"{what} path {path!r} is not of the form 'module.sub:attribute'")
    module_name, _, attr_path = path.strip().partition(":")
    if module_name in MOVED:
        log.warning("%s %r: module %r is now %r; update the path", what, path, module_name,
                    MOVED[module_name])  # fmt: skip
        module_name = MOVED[module_name]
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {path!r}: cannot import module {module_name!r}: {exc}") from exc
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise ValueError(f"{what} {path!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, attr)
    return target


@dataclass
class Registry(Generic[E]):
    """Named plug-ins of one kind (advantage estimators, policy losses, data sources): a
    decorator adds a function under a name, and a config names it by that name or by a
    ``module:function`` path to a decorated function in the user's own module.

    Entries are dataclasses with ``name`` and ``fn``; the decorated function carries its entry
    as ``fn.<attr>`` so an import path finds it.
    """

    kind: str  # in messages: "advantage estimator"
    field: str  # the config key that names one: "adv_estimator"
    decorator: str  # how one registers: "@advantage_estimator"
    attr: str  # the attribute a decorated function carries its entry in
    entries: dict[str, E] = dataclasses.field(default_factory=dict)

    def add(self, entry: E) -> None:
        """Register ``entry`` (a second function under a taken name fails, naming the first)."""
        name, fn = entry.name, entry.fn  # type: ignore[attr-defined]
        taken = self.entries.get(name)
        if taken is not None and _where(taken.fn) != _where(fn):  # type: ignore[attr-defined]
            raise ValueError(f"{self.kind} {name!r} is already {_where(taken.fn)}")  # type: ignore[attr-defined]
        self.entries[name] = entry
        setattr(fn, self.attr, entry)

    def resolve(self, name: str) -> E:
        """The entry ``name`` names; ValueError naming the config key otherwise."""
        if name in self.entries:
            return self.entries[name]
        if ":" not in str(name):
            raise ValueError(
                f"{self.field}={name!r} is not one of {list(self.entries)} "
                f"(or a 'module:function' path to a {self.decorator})"
            )
        entry = getattr(load_object(name, self.field), self.attr, None)
        if entry is None or self.entries.get(entry.name) is not entry:
            raise ValueError(f"{self.field}={name!r} is not decorated with {self.decorator}")
        return entry


def _where(fn: Callable[..., object]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"
