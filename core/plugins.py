"""Plug-ins by import path (``"package.module:attribute"``): reward functions, workflows.

Configs name their plug-ins as strings, which keeps them plain data and lets workers on other
machines resolve the same objects; this is the one place that turns such a string into the
object, with an error that names the path and what is wrong with it.
"""

from __future__ import annotations

import importlib
import logging
import re

log = logging.getLogger(__name__)

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
