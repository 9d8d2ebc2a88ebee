"""Run model-written Python in a separate, limited process (the ``<python>`` tool).

What a call gets: a fresh ``python -I -S -B -u`` (stdlib only: no site-packages, no PYTHON*
variables, no cwd on ``sys.path``) in a new session, cwd and HOME in a fresh temp dir that is
deleted afterwards, an environment of three variables (no inherited AWS_* keys or tokens), and:

* limits: wall time (the whole process group is SIGKILLed on expiry), ``RLIMIT_AS`` (memory),
  ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE=0``, and ``RLIMIT_NPROC=0``
  (no fork and no threads, unless the parent runs as root: the kernel exempts uid 0);
* network: a new, empty network namespace, ``unshare()`` in the child before exec: with a new
  user namespace when allowed (which also strips the child of host capabilities when we run as
  root), else a network namespace alone (needs root). Probed once and logged; a probed mode is
  then required (fail closed). Without either, only the audit hook blocks the network;
* an audit hook (PEP 578, cannot be removed) installed before the user code, which raises
  PermissionError on: non-AF_UNIX sockets, DNS lookups, unix sockets outside the temp dir;
  writes/creates/renames/deletes/chmods outside the temp dir; opening directories or other
  processes' ``/proc/<pid>`` files outside it; fork, exec, subprocess, os.system, posix_spawn,
  kill; ctypes, sub-interpreters, shared memory, setrlimit, gc introspection.

What it does NOT protect against (it is not a security boundary against a determined attacker):
the audit hook lives in the same interpreter as the code it watches, so monkeypatching ``os``/
``posixpath`` helpers, path objects whose ``__fspath__`` changes between calls, C extensions that
call libc directly, or interpreter bugs can get past it. Reads are allowed everywhere the OS
allows (the stdlib must load), so world-readable files (and, as root, every file) can be read.
There is no disk quota (only a per-file size), no PID/cgroup accounting, and as root
``RLIMIT_NPROC`` is not enforced by the kernel. Production should run tools in a real isolation
layer (a throwaway container with no network, gVisor, firejail/nsjail, or a remote sandbox
service) and treat this module as defence in depth and as the local/test implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_NAMESPACES = {"user+network": _CLONE_NEWUSER | _CLONE_NEWNET, "network": _CLONE_NEWNET}
_STDERR_TAIL_BYTES = 4096
_MAX_CODE_BYTES = 1 << 20
_IO_GRACE_S = 1.0
_PYTHON_FLAGS = ("-I", "-S", "-B", "-u", "-X", "utf8")


@dataclass
class SandboxLimits:
    """Resource limits for one ``run_python`` call."""

    wall_time_s: float = field(
        default=5.0,
        metadata={"help": "Wall-clock limit; the process group is killed when it expires."},
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


@dataclass
class ToolResult:
    """Outcome of one sandboxed run; user-code failures land here, never as exceptions."""

    ok: bool
    output: str
    error: str
    timed_out: bool
    wall_s: float


DEFAULT_LIMITS = SandboxLimits()

# Runs in the child before the user code (stdin carries the source). Keep it stdlib-only.
_PRELUDE = r"""
import linecache, os, posix, resource, socket, stat, sys, traceback, types, _posixsubprocess
DENY = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.kill", "os.killpg", "os.symlink", "resource.setrlimit",
        "resource.prlimit", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
        "socket.sethostname", "sqlite3.enable_load_extension", "sqlite3.load_extension"}
NO_IMPORT = {"_ctypes", "_posixsubprocess", "_posixshmem", "_xxsubinterpreters", "_testcapi",
             "_testinternalcapi", "_ctypes_test", "_xxtestfuzz"}
# event -> (index of a path argument, index of its dir_fd argument or None), ...
PATHS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
         "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.chmod": ((0, 2),),
         "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),),
         "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 1),)}
ADDRESS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}

def make_hook(root, pid):  # helpers bound now: rebinding os.path.realpath etc. later has no effect
    realpath, join, fsdecode, getcwd, readlink = os.path.realpath, os.path.join, os.fsdecode, posix.getcwd, posix.readlink
    stat_, isdir, wflags = posix.stat, stat.S_ISDIR, os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def resolve(path, dir_fd=None):
        if isinstance(path, int):
            return readlink(f"/proc/self/fd/{path}")
        base = readlink(f"/proc/self/fd/{dir_fd}") if isinstance(dir_fd, int) and dir_fd >= 0 else getcwd()
        return realpath(join(base, fsdecode(path)))
    def inside(path, dir_fd=None):
        p = resolve(path, dir_fd)
        return p == root or p.startswith(root + "/")
    def readable(path):  # not other processes' /proc entries, no directory fds outside root
        p = resolve(path)
        parts = p.split("/")
        if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != pid:
            return False
        try:
            return inside(p) or not isdir(stat_(p).st_mode)
        except OSError:
            return True
    def allowed(event, args):
        if event == "open":
            path, mode, flags = args
            write = (isinstance(mode, str) and not set(mode).isdisjoint("wax+")) or flags & wflags
            if isinstance(path, int):
                return True
            return (inside(path) or resolve(path) == "/dev/null") if write else readable(path)
        if event in PATHS:
            return all(inside(args[i], None if j is None else args[j]) for i, j in PATHS[event])
        if event in ADDRESS:
            a = args[1]
            return a is None or (isinstance(a, (str, bytes)) and a[:1] not in ("", b"", "\0", b"\0") and inside(a))
        if event == "sqlite3.connect":
            db = fsdecode(args[0])
            return db in ("", ":memory:") or (not db.startswith("file:") and inside(db))
        if event == "import":
            return args[0] not in NO_IMPORT
        return args[1] == socket.AF_UNIX if event == "socket.__new__" else event not in DENY
    def hook(event, args):
        if not allowed(event, args):
            what = args[0] if args and isinstance(args[0], (str, bytes, int)) else ""
            raise PermissionError(f"sandbox: {event} {what!r} is not allowed")
    return hook

def no_subprocess(*args, **kwargs):
    raise PermissionError("sandbox: subprocesses are not allowed")

def main():
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    _posixsubprocess.fork_exec = no_subprocess  # it forks without raising an audit event
    src = sys.stdin.buffer.read().decode("utf-8", "replace")
    sys.argv, sys.modules["__main__"] = ["main.py"], (mod := types.ModuleType("__main__"))
    linecache.cache["main.py"] = (len(src), None, src.splitlines(True), "main.py")
    sys.addaudithook(make_hook(posix.getcwd(), str(posix.getpid())))
    try:
        exec(compile(src, "main.py", "exec"), mod.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            mod.__dict__.clear()  # free the user's objects so the traceback can be printed
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next  # drop this prelude's frames
        traceback.print_exception(type(exc), exc, tb)
        sys.exit(1)

main()
"""


@functools.cache
def _libc_unshare() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(None, use_errno=True), "unshare", None)


def _probe_unshare(flags: int) -> str:
    """'' if a fresh child may ``unshare(flags)``, else why not."""
    probe = f"import ctypes, os\nif ctypes.CDLL(None, use_errno=True).unshare({flags}): os._exit(ctypes.get_errno())"
    try:
        rc = subprocess.run(
            [sys.executable, "-I", "-S", "-c", probe],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        ).returncode
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return "" if rc == 0 else os.strerror(rc) if rc > 0 else f"probe exit status {rc}"


@functools.cache
def namespace_flags() -> int:
    """The ``unshare`` flags tool processes get here (0: none); probed once and logged."""
    reasons = []
    for name, flags in _NAMESPACES.items():
        why = _probe_unshare(flags) if _libc_unshare() else "no unshare() on this platform"
        if not why:
            log.info("sandbox: tool code runs in a fresh %s namespace", name)
            return flags
        reasons.append(f"{name}: {why}")
    log.warning(
        "sandbox: no network namespace (%s); only the audit hook blocks the network",
        "; ".join(reasons),
    )
    return 0


def netns_available() -> bool:
    """Whether tool processes get their own, empty network namespace on this machine."""
    return bool(namespace_flags() & _CLONE_NEWNET)


def _preexec(limits: SandboxLimits, flags: int) -> Callable[[], None]:
    """Child-side setup between fork and exec: only C calls, no locks, no logging."""
    mib, cpu, unshare = 1024 * 1024, limits.cpu_time_s, _libc_unshare() if flags else None
    rlimits = [
        (resource.RLIMIT_AS, (limits.memory_mb * mib,) * 2),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_FSIZE, (limits.max_file_mb * mib,) * 2),
        (resource.RLIMIT_NOFILE, (32, 32)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]

    def setup() -> None:
        if unshare is not None and unshare(flags) != 0:
            raise OSError(ctypes.get_errno(), "unshare() failed")
        for which, value in rlimits:
            resource.setrlimit(which, value)

    return setup


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
    with contextlib.suppress(
        BrokenPipeError, ConnectionResetError
    ):  # a dead child's status says why
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
    """Run ``code`` as ``__main__`` in a fresh sandboxed process; never raises for user errors."""
    start = time.monotonic()
    source = code.encode("utf-8", "replace")
    if len(source) > _MAX_CODE_BYTES:
        return ToolResult(False, "", f"code too large ({len(source)} bytes)", False, 0.0)
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="asyncrl-sandbox-"))
    try:
        return await _execute(source, limits, workdir, start)
    finally:
        await asyncio.to_thread(_remove_tree, workdir)


async def _execute(source: bytes, limits: SandboxLimits, workdir: str, start: float) -> ToolResult:
    pipe, env = (
        asyncio.subprocess.PIPE,
        {"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin"},
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *_PYTHON_FLAGS,
            "-c",
            _PRELUDE,
            stdin=pipe,
            stdout=pipe,
            stderr=pipe,
            cwd=workdir,
            env=env,
            start_new_session=True,
            preexec_fn=_preexec(limits, namespace_flags()),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.error("sandbox: could not start the tool process: %s", exc)
        return ToolResult(
            False, "", f"sandbox setup failed: {exc}", False, time.monotonic() - start
        )
    assert proc.stdin and proc.stdout and proc.stderr  # all pipes
    out, err = _Capture(limits.max_output_bytes), _Capture(_STDERR_TAIL_BYTES, tail=True)
    io = asyncio.gather(_feed(proc.stdin, source), out.pump(proc.stdout), err.pump(proc.stderr))
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), limits.wall_time_s)
    except TimeoutError:
        timed_out = True
    finally:
        _kill_group(proc.pid)  # also on cancellation; strays in the group die with it
    rc = await proc.wait()
    try:
        await asyncio.wait_for(io, _IO_GRACE_S)
    except TimeoutError:
        log.warning("sandbox: output pipes of pid %d stayed open after exit", proc.pid)
    wall = time.monotonic() - start
    log.debug("sandbox: pid %d rc=%s timed_out=%s %.3fs", proc.pid, rc, timed_out, wall)
    if timed_out:
        return ToolResult(False, out.text(), f"timeout after {limits.wall_time_s} s", True, wall)
    error = "" if rc == 0 else _describe(rc, err.text(), limits)
    return ToolResult(rc == 0, out.text(), error, False, wall)
