"""The ``bash`` tool: a shell command run by the system's bash inside the jail of
:mod:`core.sandbox.run`, over an episode's files.

Every call is a fresh jail and nothing in it outlives the call, so an episode's files live on
the caller's side as ``{relative path: text}``. A call writes them into the jail's workdir,
runs the command there (stdout and stderr together, as a terminal shows them), then lists the
workdir back: a later call sees what an earlier one created, changed, moved or deleted, and the
caller can check the final state. A per-call random marker separates the command's output
from the listing, so no output can forge it.

The command may start processes (pipes, ``grep``, ``find``, ``mv``...): ``RLIMIT_NPROC`` is
``max_processes`` instead of the Python tool's 0. For a root caller the jail runs as uid 65534,
so the limit bounds the processes of all shell calls running at once together; for a non-root
caller it would count the caller's own processes too, so there it is left as it was (the PID
namespace and the wall-time kill still end the whole tree). Everything else — namespaces,
read-only root, seccomp, memory/CPU/file/disk limits, no network — is the Python tool's.
"""

from __future__ import annotations

import os
import resource
import secrets
import shlex
from dataclasses import dataclass, replace

from core.sandbox.run import DEFAULT_LIMITS, Program, SandboxLimits, run_jailed

BASH = "/bin/bash"
# The command's output and the listing together; past this the call is an error (no file is
# lost: the files stay as they were). The model sees ``max_output_chars`` of the output.
_CAPTURE_BYTES = 1 << 21


@dataclass
class ShellResult:
    """One command's outcome and the files after it."""

    output: str  # stdout and stderr, interleaved, cut to max_output_chars
    exit_code: int | None  # None when it did not finish (timeout, a limit, setup failure)
    files: dict[str, str]  # the workdir's files after the call (unchanged if it did not finish)
    error: str = ""  # why it did not finish

    def for_model(self) -> str:
        """The tool result a model reads: the output, and the exit status when not 0."""
        output = self.output.rstrip("\n")
        if self.exit_code is None:
            return f"{output}\nerror: {self.error}".strip()
        if self.exit_code != 0:
            return f"{output}\n[exit status {self.exit_code}]".strip()
        return output


def _process_limit(max_processes: int) -> int:
    if os.geteuid() == 0:
        return max_processes
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    return soft


def script(command: str, files: dict[str, str], marker: str) -> str:
    """The bash program of one call: write ``files``, run ``command`` in a child shell, stop
    whatever it left running, then list the workdir after ``marker``: the command's exit status,
    NUL-separated path/content pairs (an empty folder as ``path/`` with no content), and an end
    mark that says the listing is whole."""
    folders = {os.path.dirname(path.rstrip("/")) for path in files}
    folders |= {path.rstrip("/") for path in files if path.endswith("/")}
    lines = ["set +euf", "__root=$PWD"]
    if folders - {""}:
        lines.append("mkdir -p -- " + " ".join(shlex.quote(d) for d in sorted(folders - {""})))
    lines += [
        f"printf '%s' {shlex.quote(text)} > {shlex.quote(path)}"
        for path, text in files.items()
        if not path.endswith("/")
    ]
    lines += [
        f"__cmd={shlex.quote(command)}",
        # A child shell: the command cannot redefine or skip what follows, nor see the marker.
        'bash --noprofile --norc -c "$__cmd" </dev/null 2>&1',
        "__rc=$?",
        # Background jobs must not write into the listing. PID 2 is the tool in the jail's own
        # PID namespace, where -1 reaches only the jail's processes (never without one).
        "(( $$ == 2 )) && kill -9 -1 2>/dev/null",
        'cd "$__root" || exit 1',
        f"printf '\\n{marker} %d\\0' \"$__rc\"",
        "shopt -s globstar dotglob nullglob",
        "for __f in **; do",
        "  if [[ -L $__f ]]; then continue",
        "  elif [[ -f $__f ]]; then",
        "    IFS= read -r -d '' __c < \"$__f\" || :",
        '    printf \'%s\\0%s\\0\' "$__f" "$__c"',
        "  elif [[ -d $__f ]]; then",
        '    __in=("$__f"/*)',
        "    (( ${#__in[@]} )) || printf '%s/\\0\\0' \"$__f\"",
        "  fi",
        "done",
        f"printf '{marker}-end\\0'",
    ]
    return "\n".join(lines) + "\n"


def parse(stdout: str, marker: str) -> tuple[str, int, dict[str, str]] | None:
    """``(output, exit status, files)`` from a call's stdout; None unless the listing is whole
    (cut short by the capture limit, or never written)."""
    head, found, tail = stdout.rpartition(f"\n{marker} ")
    if not found or not tail.endswith(f"\0{marker}-end\0"):
        return None
    status, _, listing = tail.removesuffix(f"{marker}-end\0").partition("\0")
    parts = listing.split("\0")[:-1]
    if not status.isdigit() or len(parts) % 2:
        return None
    return head, int(status), dict(zip(parts[::2], parts[1::2], strict=True))


async def run_bash(
    command: str,
    files: dict[str, str],
    limits: SandboxLimits = DEFAULT_LIMITS,
    *,
    max_processes: int = 64,
    max_output_chars: int = 2000,
) -> ShellResult:
    """Run ``command`` with bash in a fresh jail whose workdir holds ``files``; never raises for
    the command's failures."""
    marker = f"__asyncrl_files_{secrets.token_hex(8)}__"
    program = Program([BASH, "--noprofile", "--norc", "-s"], _process_limit(max_processes))
    capture = replace(limits, max_output_bytes=max(limits.max_output_bytes, _CAPTURE_BYTES))
    result = await run_jailed(script(command, files, marker), capture, program)
    parsed = parse(result.output, marker)
    if parsed is None or result.timed_out:
        output = result.output.split(f"\n{marker} ", 1)[0]
        error = result.error or (
            f"the command's output and files exceed the sandbox's {_CAPTURE_BYTES >> 20} MiB"
        )
        return ShellResult(_cut(output, max_output_chars), None, dict(files), error)
    output, status, after = parsed
    return ShellResult(_cut(output, max_output_chars), status, after)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n...[{len(text) - limit} more characters]"
