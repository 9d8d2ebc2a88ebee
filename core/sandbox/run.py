"""Run model-written Python in a jailed, limited process (the ``<python>`` tool).

The boundary is the kernel's, set up by :mod:`core.sandbox.kernel` before the tool's
interpreter starts, so nothing the tool code does in Python can lift it:

* uid/gid 65534 ("nobody") through a user namespace, no capabilities, ``no_new_privs``; when
  the trainer runs as root it drops to uid 65534 first, so root-owned files are not the tool's;
* own PID, network (empty: only ``lo``), IPC and UTS namespaces: no other process to see,
  signal or ptrace; no host TCP/UDP ports, no abstract unix sockets;
* own mount namespace: a read-only root holding only ``/usr``, ``/lib*``, the interpreter, five
  device nodes and ``/proc`` of its own PID namespace; the cwd, HOME and TMPDIR ``/sandbox`` is
  a tmpfs capped at ``max_disk_mb`` (noexec), gone with the namespace, however the call ends;
* seccomp: no unix/packet/vsock sockets, mknod/mkfifo, ptrace, mount, namespaces, bpf,
  io_uring, keyrings, module loading, ...;
* rlimits: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``,
  ``RLIMIT_CORE=0``, ``RLIMIT_NPROC=0`` (no fork, no threads); a wall-time limit after which
  the whole tree is SIGKILLed; parent-death signals at every level, so a tool process never
  outlives the rollout process, even one killed with SIGKILL.

Each call is a fresh ``python -I -S -B -u`` (stdlib only, no PYTHON* variables, no cwd on
``sys.path``) with an environment of three variables. An audit hook (PEP 578) installed before
the user code still refuses sockets, writes outside the workdir, subprocesses and ctypes, for
clearer errors and as defence in depth; it is not what the isolation rests on.

Where the kernel lacks a feature (:data:`FEATURES`; probed once per process and logged),
``SandboxLimits.isolation`` decides: ``"strict"`` (the default) refuses to run tool code and
says what is missing; ``"best_effort"`` runs it with what exists and warns once, naming what is
missing. Without a mount namespace the workdir is a host temp dir, removed after the call (not
when the trainer is SIGKILLed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from core.sandbox.kernel import FEATURES, NOBODY, WORKDIR
from core.sandbox.prelude import PRELUDE as _PRELUDE  # tests swap it: keep the name

log = logging.getLogger(__name__)

ISOLATION_MODES = ("strict", "best_effort")
_JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.py")
_STDERR_TAIL_BYTES = 4096
_MAX_CODE_BYTES = 1 << 20
_IO_GRACE_S = 1.0
_PROBE_TIMEOUT_S = 30.0
_PYTHON_FLAGS = ("-I", "-S", "-B", "-u", "-X", "utf8")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


@dataclass
class SandboxLimits:
    """Resource limits and the isolation policy for one ``run_python`` call."""

    wall_time_s: float = field(
        default=5.0,
        metadata={"help": "Wall-clock limit; the process tree is killed when it expires."},
    )
    cpu_time_s: int = field(default=5, metadata={"help": "CPU-seconds limit (RLIMIT_CPU)."})
    memory_mb: int = field(
        default=256, metadata={"help": "Address-space limit in MiB (RLIMIT_AS)."}
    )
    max_output_bytes: int = field(
        default=4096, metadata={"help": "Stdout kept; the rest is dropped and a marker appended."}
    )
    max_file_mb: int = field(
        default=8, metadata={"help": "Largest file the code may write, in MiB (RLIMIT_FSIZE)."}
    )
    max_disk_mb: int = field(
        default=64, metadata={"help": "Size of the tmpfs workdir, all files together, in MiB."}
    )
    isolation: str = field(
        default="strict",
        metadata={
            "help": "When the kernel lacks a sandbox feature: 'strict' refuses to run tool "
            "code, 'best_effort' runs it with what exists (warning once)."
        },
    )

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(
                f"sandbox isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}"
            )


@dataclass(frozen=True)
class Program:
    """What a jailed call runs (its stdin is the call's input): by default the Python prelude,
    which reads the code from stdin."""

    argv: list[str]
    # RLIMIT_NPROC: 0 = no fork (Python tool code needs none). It counts every process of the
    # tool's real uid: for a root caller 65534, shared by all calls running at once.
    max_processes: int = 0


@dataclass
class ToolResult:
    """Outcome of one sandboxed run; user-code failures land here, never as exceptions."""

    ok: bool
    output: str
    error: str
    timed_out: bool
    wall_s: float


@dataclass(frozen=True)
class Isolation:
    """What the jail sets up on this machine: feature names available, and why others are not."""

    available: frozenset[str]
    missing: dict[str, str]

    def describe_missing(self) -> str:
        return "; ".join(f"{name} ({why})" for name, why in sorted(self.missing.items()))


DEFAULT_LIMITS = SandboxLimits()


@functools.cache
def _interpreter() -> str:
    """The real interpreter binary (a venv's python is a link to it; -S skips the venv)."""
    return os.path.realpath(sys.executable)


@functools.cache
def _view() -> tuple[dict[str, str], ...]:
    """What the tool's read-only root holds: system dirs, the interpreter's prefix, devices."""
    entries: list[dict[str, str]] = []
    bound: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            entries.append({"kind": "symlink", "path": top, "target": os.readlink(top)})
        elif os.path.isdir(top):
            entries.append({"kind": "dir", "path": top})
            bound.append(top)
    prefixes = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(_interpreter())}
    for path in sorted(os.path.realpath(p) for p in prefixes):
        if not any(path == b or path.startswith(b + "/") for b in bound):
            entries.append({"kind": "dir", "path": path})
            bound.append(path)
    if os.path.isfile("/etc/ld.so.cache"):
        entries.append({"kind": "file", "path": "/etc/ld.so.cache"})
    entries += [{"kind": "dev", "path": dev} for dev in _DEVICES if os.path.exists(dev)]
    return tuple(entries)


def _jail_config(
    limits: SandboxLimits,
    want: set[str],
    status_fd: int,
    host_workdir: str | None,
    program: Program | None = None,
) -> dict:
    mib, cpu = 1024 * 1024, limits.cpu_time_s
    program = program or Program([_interpreter(), *_PYTHON_FLAGS, "-c", _PRELUDE])
    workdir = host_workdir or WORKDIR
    return {
        "want": sorted(want),
        "required": sorted(want),
        "status_fd": status_fd,
        "parent": os.getpid(),
        "view": list(_view()),
        "disk_bytes": limits.max_disk_mb * mib,
        "host_workdir": host_workdir or "",
        "rlimits": [
            (resource.RLIMIT_AS, limits.memory_mb * mib, limits.memory_mb * mib),
            (resource.RLIMIT_CPU, cpu, cpu + 1),
            (resource.RLIMIT_FSIZE, limits.max_file_mb * mib, limits.max_file_mb * mib),
            (resource.RLIMIT_NOFILE, 32, 32),
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_NPROC, program.max_processes, program.max_processes),
        ],
        "argv": program.argv,
        "env": {"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin"},
    }


def _set_rlimits(rlimits: list[tuple[int, int, int]]) -> None:
    for which, soft, hard in rlimits:
        resource.setrlimit(which, (soft, hard))


def _jail_argv(config: dict) -> list[str]:
    return [_interpreter(), "-I", "-S", "-B", _JAIL, json.dumps(config)]


@dataclass
class _Status:
    """What the jail wrote on its status pipe."""

    missing: dict[str, str] = field(default_factory=dict)
    fatal: str = ""
    signal: int = 0

    @classmethod
    def parse(cls, data: bytes) -> _Status:
        status = cls()
        for line in data.decode("utf-8", "replace").splitlines():
            kind, _, rest = line.partition(" ")
            name, _, why = rest.partition(" ")
            if kind == "missing":
                status.missing[name] = why
            elif kind == "fatal":
                status.fatal = f"{name}: {why}"
            elif kind == "signal" and name.isdigit():
                status.signal = int(name)
        return status


def _read_status(fd: int) -> _Status:
    """What is in the pipe now (its writers have exited or closed it on exec)."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    os.close(fd)
    return _Status.parse(b"".join(chunks))


def _probe_once(want: set[str]) -> tuple[set[str], dict[str, str]]:
    """Run ``print('ok')`` in a jail that wants ``want``; which of them it got, and why not."""
    limits = SandboxLimits(isolation="best_effort")
    host_workdir = _make_host_workdir()
    status_r, status_w = os.pipe()
    config = _jail_config(limits, want, status_w, host_workdir) | {"required": []}
    try:
        proc = subprocess.run(
            _jail_argv(config),
            input=b"print('ok')",
            capture_output=True,
            cwd=host_workdir,
            env={},
            start_new_session=True,
            pass_fds=(status_w,),
            timeout=_PROBE_TIMEOUT_S,
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except (OSError, subprocess.SubprocessError) as exc:
        rc, out, err = -1, b"", str(exc).encode()
    finally:
        os.close(status_w)
        _remove_tree(host_workdir)
    status = _read_status(status_r)
    if rc == 0 and out == b"ok\n" and not status.fatal:
        return want - set(status.missing), status.missing
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {rc}"]
    why = f"tool interpreter did not start: {status.fatal or tail[0]}"[:300]
    return set(), dict.fromkeys(want, why)


@functools.cache
def isolation() -> Isolation:
    """The jail features this machine gives tool processes; probed once per process, logged."""
    if not sys.platform.startswith("linux"):
        return Isolation(frozenset(), dict.fromkeys(FEATURES, f"not Linux ({sys.platform})"))
    want = set(FEATURES)
    available, missing = _probe_once(want)
    first = missing
    # If the interpreter did not start, do without its view, then without uid 65534 too (which
    # may not reach an interpreter under /root), keeping the first reason for what was dropped.
    for drop in ("mount-namespace", "unprivileged-uid"):
        if available:
            break
        want.discard(drop)
        available, retry_missing = _probe_once(want)
        missing = {name: first[name] for name in set(FEATURES) - want} | retry_missing
    result = Isolation(frozenset(available), missing)
    if result.missing:
        log.warning("sandbox: this machine lacks %s", result.describe_missing())
    else:
        log.info("sandbox: tool code runs jailed (%s)", ", ".join(sorted(available)))
    return result


def netns_available() -> bool:
    """Whether tool processes get their own, empty network namespace on this machine."""
    return "network-namespace" in isolation().available


@functools.cache
def _warn_once(mode: str, missing: str) -> None:
    if mode == "strict":
        log.error("sandbox: refusing to run tool code: this machine lacks %s", missing)
    else:
        log.warning("sandbox: running tool code without %s (tools.sandbox=best_effort)", missing)


def _make_host_workdir() -> str:
    """A host temp dir for when there is no private tmpfs; the tool's uid may write it."""
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="asyncrl-sandbox-"))
    if os.geteuid() == 0:
        os.chown(workdir, NOBODY, NOBODY)
    return workdir


class _Capture:
    """Keeps the first (``tail=False``) or last ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int, tail: bool = False) -> None:
        self.cap, self.tail, self.data, self.total = cap, tail, bytearray(), 0

    async def pump(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.total += len(chunk)
            if self.tail:
                self.data = (self.data + chunk)[-self.cap :]
            elif len(self.data) < self.cap:
                self.data += chunk[: self.cap - len(self.data)]

    def text(self) -> str:
        out = self.data.decode("utf-8", "replace")
        dropped = self.total - len(self.data)
        return f"{out}\n...[truncated {dropped} bytes]" if dropped and not self.tail else out


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # its status says why
        stdin.write(data)
        await stdin.drain()
        stdin.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        log.warning("sandbox: could not remove %s", path)


def _describe(rc: int, stderr: str, limits: SandboxLimits) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1][:200] if lines else ""
    if rc < 0:
        if -rc == signal.SIGXCPU:
            return f"cpu time limit ({limits.cpu_time_s} s)"
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        return f"killed by {name}" + ("; out of memory?" if -rc == signal.SIGKILL else "")
    if any(ln.startswith("MemoryError") for ln in lines[-3:]):
        return f"memory limit ({limits.memory_mb} MB): {last}"
    return f"exit status {rc}: {last}"


async def run_python(code: str, limits: SandboxLimits = DEFAULT_LIMITS) -> ToolResult:
    """Run ``code`` as ``__main__`` in a fresh jailed process; never raises for user errors."""
    return await run_jailed(code, limits)


async def run_jailed(
    stdin: str, limits: SandboxLimits = DEFAULT_LIMITS, program: Program | None = None
) -> ToolResult:
    """Run ``program`` (default: Python, reading its code from stdin) in a fresh jail with
    ``stdin`` as its input; never raises for user errors."""
    start = time.monotonic()
    source = stdin.encode("utf-8", "replace")
    if len(source) > _MAX_CODE_BYTES:
        return ToolResult(False, "", f"code too large ({len(source)} bytes)", False, 0.0)
    iso = await asyncio.to_thread(isolation)
    if iso.missing:
        _warn_once(limits.isolation, iso.describe_missing())
        if limits.isolation == "strict":
            error = (
                f"sandbox refused to run tool code: this machine lacks {iso.describe_missing()}; "
                "set tools.sandbox=best_effort to run it with less isolation"
            )
            return ToolResult(False, "", error, False, time.monotonic() - start)
    host_workdir = None if "mount-namespace" in iso.available else _make_host_workdir()
    try:
        return await _execute(source, limits, set(iso.available), host_workdir, start, program)
    finally:
        if host_workdir:
            await asyncio.to_thread(_remove_tree, host_workdir)


async def _execute(
    source: bytes,
    limits: SandboxLimits,
    want: set[str],
    host_workdir: str | None,
    start: float,
    program: Program | None = None,
) -> ToolResult:
    pipe = asyncio.subprocess.PIPE
    status_r, status_w = os.pipe()
    config = _jail_config(limits, want, status_w, host_workdir, program)
    if sys.platform.startswith("linux"):
        argv, env, preexec = _jail_argv(config), {}, None
    else:  # no jail (best_effort only): the interpreter, rlimits and the audit hook
        argv, env = config["argv"], config["env"]
        preexec = functools.partial(_set_rlimits, config["rlimits"][:-1])  # NPROC: the prelude
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=pipe,
            stdout=pipe,
            stderr=pipe,
            cwd=host_workdir or "/",
            env=env,
            start_new_session=True,
            pass_fds=(status_w,),
            preexec_fn=preexec,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(status_r)
        log.error("sandbox: could not start the tool process: %s", exc)
        return ToolResult(
            False, "", f"sandbox setup failed: {exc}", False, time.monotonic() - start
        )
    finally:
        os.close(status_w)
    assert proc.stdin and proc.stdout and proc.stderr  # all pipes
    out, err = _Capture(limits.max_output_bytes), _Capture(_STDERR_TAIL_BYTES, tail=True)
    io = asyncio.gather(_feed(proc.stdin, source), out.pump(proc.stdout), err.pump(proc.stderr))
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), limits.wall_time_s)
    except TimeoutError:
        timed_out = True
    finally:
        _kill_group(proc.pid)  # also on cancellation; the rest die by parent-death signal
        try:
            if proc.returncode is None:
                await asyncio.shield(proc.wait())
        finally:
            status = _read_status(status_r)
    rc = proc.returncode
    try:
        await asyncio.wait_for(io, _IO_GRACE_S)
    except TimeoutError:
        log.warning("sandbox: output pipes of pid %d stayed open after exit", proc.pid)
    wall = time.monotonic() - start
    log.debug("sandbox: pid %d rc=%s timed_out=%s %.3fs", proc.pid, rc, timed_out, wall)
    if status.fatal:
        log.error("sandbox: setup failed: %s", status.fatal)
        return ToolResult(False, "", f"sandbox setup failed: {status.fatal}", False, wall)
    if timed_out:
        return ToolResult(False, out.text(), f"timeout after {limits.wall_time_s} s", True, wall)
    rc = -status.signal if status.signal else rc
    error = "" if rc == 0 else _describe(rc, err.text(), limits)
    return ToolResult(rc == 0, out.text(), error, False, wall)
