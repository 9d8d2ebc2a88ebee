"""Running untrusted Python (tool calls, code completions under test) inside a jail.

:func:`run_python` (in :mod:`core.sandbox.run`) runs a program in a fresh process behind the
kernel's boundary (namespaces, seccomp, rlimits: :mod:`core.sandbox.kernel`, with the
:mod:`core.sandbox.prelude` as defence in depth) and returns a :class:`ToolResult`; user-code
failures land there, never as exceptions. Used by the tagged-tool workflow's ``python`` tool
(:mod:`core.workflows.tools`) and the code reward (:mod:`core.rewards.code`).
:func:`run_bash` (in :mod:`core.sandbox.shell`) runs a shell command with bash in the same jail,
over an episode's files (the terminal agent's ``bash`` tool).
"""

from core.sandbox.run import (
    DEFAULT_LIMITS,
    ISOLATION_MODES,
    Isolation,
    Program,
    SandboxLimits,
    ToolResult,
    isolation,
    netns_available,
    run_jailed,
    run_python,
)
from core.sandbox.shell import ShellResult, run_bash

__all__ = [
    "DEFAULT_LIMITS",
    "ISOLATION_MODES",
    "Isolation",
    "Program",
    "SandboxLimits",
    "ShellResult",
    "ToolResult",
    "isolation",
    "netns_available",
    "run_bash",
    "run_jailed",
    "run_python",
]
