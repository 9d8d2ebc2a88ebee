"""Escape attempts against the python tool sandbox: every one must fail, on the host too.

Each attempt runs twice where it makes sense: ``hooked`` is the real sandbox, with tool code
that first disables the audit hook's path checks (``posixpath.abspath`` patched, the payload
from the security review); ``hookless`` runs with no audit hook at all, as if the code had got
past every Python-level check (ctypes included). What stops an attempt must be the kernel.
Every test checks the host side: the file, socket, process or directory the attempt aimed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from core.sandbox import SandboxLimits, ToolResult, run_python
from core.sandbox import run as sandbox
from tests.processes import live_descendants

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
HOOK_LINE = "sys.addaudithook(make_hook(posix.getcwd(), str(posix.getpid())))"
BYPASS = "import os, posixpath\nposixpath.abspath = lambda p: os.getcwd()\n"
LIMITS = SandboxLimits(wall_time_s=10.0)
MARKER = "import linecache"  # first line of the prelude: in the tool process's command line


def run(code: str, limits: SandboxLimits = LIMITS) -> ToolResult:
    return asyncio.run(run_python(BYPASS + code, limits))


@pytest.fixture(params=["hooked", "hookless"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "hookless":
        _remove_audit_hook(monkeypatch)
    return request.param


@pytest.fixture
def hookless(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool code with no audit hook: ctypes, fork, kill, ... all reach the kernel."""
    _remove_audit_hook(monkeypatch)


def _remove_audit_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HOOK_LINE in sandbox._PRELUDE
    monkeypatch.setattr(sandbox, "_PRELUDE", sandbox._PRELUDE.replace(HOOK_LINE, "pass"))


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """After the test: no new sandbox temp dir on the host, no tool process alive."""
    pattern = os.path.join(tempfile.gettempdir(), "asyncrl-sandbox-*")
    dirs_before, procs_before = set(glob.glob(pattern)), {p.pid for p in live_descendants()}
    yield
    strays = _wait_until_gone([p for p in live_descendants() if p.pid not in procs_before])
    left = _clean_up(strays, set(glob.glob(pattern)) - dirs_before)
    assert strays == [] and left == [], f"outlived their call: {strays}, {left}"


def _clean_up(strays: list[psutil.Process], dirs: set[str]) -> list[str]:
    """Kill and remove what an attempt left, before failing, so that no failure leaks it."""
    for proc in strays:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    return sorted(dirs)


def _wait_until_gone(procs: list[psutil.Process], timeout: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _is_tool(proc: psutil.Process) -> bool:
    """The process running the tool code (not the jail's supervisor or init)."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return "-c" in cmd and MARKER in cmd[-1] and not any("sandbox_kernel" in a for a in cmd)


@pytest.fixture
def victim() -> Iterator[subprocess.Popen]:
    """A host process holding a secret in its environment."""
    env = {"PATH": os.environ.get("PATH", ""), "ASYNCRL_VICTIM_SECRET": "fake-secret-5d2e"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    yield proc
    proc.kill()
    proc.wait()


# --- files ----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["append", "chmod", "create_in_tmp", "create_in_stdlib"])
def test_patched_path_checks_cannot_touch_host_files(
    target: str, mode: str, tmp_path: Path, no_leftovers: None
) -> None:
    victim_file = tmp_path / "victim.txt"
    victim_file.write_text("keep me")
    victim_file.chmod(0o644)
    created = {
        "create_in_tmp": Path(tempfile.gettempdir()) / f"asyncrl-escape-{uuid.uuid4().hex}",
        "create_in_stdlib": Path(os.__file__).parent / f"asyncrl_escape_{uuid.uuid4().hex}.py",
    }
    code = {
        "append": f"open({str(victim_file)!r}, 'a').write('pwned')",
        "chmod": f"os.chmod({str(victim_file)!r}, 0o777)",
        "create_in_tmp": f"open({str(created['create_in_tmp'])!r}, 'w').write('pwned')",
        "create_in_stdlib": f"open({str(created['create_in_stdlib'])!r}, 'w').write('pwned')",
    }[target]
    try:
        result = run(code)
        assert not result.ok, result
    finally:
        leaked = [p for p in created.values() if p.exists()]
        for path in leaked:
            path.unlink()
    assert leaked == []
    assert victim_file.read_text() == "keep me"
    assert stat.S_IMODE(victim_file.stat().st_mode) == 0o644


def test_root_only_files_are_not_readable(mode: str, no_leftovers: None) -> None:
    result = run("print(open('/etc/shadow').read())")
    assert not result.ok and "root:" not in result.output, result


def test_the_view_holds_only_what_python_needs(hookless: None) -> None:
    """No host home, /etc, /tmp, /var, /sys; the root and the interpreter are read-only."""
    stdlib_file = Path(os.__file__).parent / f"asyncrl_escape_{uuid.uuid4().hex}.py"
    result = run(
        "import os\nprint(sorted(os.listdir('/')), os.getcwd())\n"
        "for path in ('/etc/hostname', '/etc/ssl', '/tmp', '/var', '/sys', '/home', '/proc/1/root/etc/shadow'):\n"
        "    print(path, os.path.exists(path))\n"
        "try:\n"
        f"    open({str(stdlib_file)!r}, 'w')\n"
        "except OSError as exc:\n"
        "    print('stdlib', exc.strerror)\n"
        "open('/sandbox_escape', 'w')"
    )
    escaped = [p for p in (Path("/sandbox_escape"), stdlib_file) if p.exists()]
    for path in escaped:
        path.unlink()
    assert escaped == []
    assert not result.ok and "Read-only file system" in result.error, result
    assert "True" not in result.output and "stdlib Read-only file system" in result.output


def test_disk_use_is_capped(mode: str, no_leftovers: None) -> None:
    """Many files, each under the per-file limit, may not fill the host disk (the review: 2.4 GB)."""
    code = (
        "total = 0\n"
        "try:\n"
        "    for i in range(256):\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * 2**20)\n"
        "        total += 1\n"
        "finally:\n"
        "    print(total, flush=True)\n"
    )
    result = run(code)
    assert not result.ok and "No space left on device" in result.error, result
    assert int(result.output) < 256


def test_device_nodes_and_fifos_cannot_be_made(mode: str, no_leftovers: None) -> None:
    code = (
        "import stat\nfailed = []\n"
        "for make in (lambda: os.mkfifo('fifo'), lambda: os.mknod('null', stat.S_IFCHR | 0o666, os.makedev(1, 3)),\n"
        "             lambda: os.mknod('sda', stat.S_IFBLK | 0o666, os.makedev(8, 0)), lambda: os.mknod('plain', stat.S_IFIFO | 0o600)):\n"
        "    try:\n"
        "        make()\n"
        "    except OSError as exc:\n"
        "        failed.append(exc.errno)\n"
        "print(failed, sorted(os.listdir('.')))\n"
    )
    result = run(code)
    assert result.ok, result
    assert result.output == "[1, 1, 1, 1] []\n"  # EPERM each time, nothing created


# --- sockets and the network ----------------------------------------------------------------


def test_host_unix_sockets_are_unreachable(mode: str, no_leftovers: None) -> None:
    short_dir = tempfile.mkdtemp(prefix="asyncrl-esc-", dir="/tmp")
    path = os.path.join(short_dir, "s.sock")
    abstract = f"\0asyncrl-escape-{uuid.uuid4().hex[:12]}"
    servers = []
    try:
        for address in (path, abstract):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(address)
            server.listen(8)
            server.setblocking(False)
            servers.append(server)
        for address in (path, abstract):
            code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({address!r})\ns.send(b'x')"
            result = run(code)
            assert not result.ok, (address, result)
        for server in servers:
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        for server in servers:
            server.close()
        os.unlink(path)
        os.rmdir(short_dir)


def test_host_tcp_and_udp_are_unreachable(mode: str, no_leftovers: None) -> None:
    addresses = ["127.0.0.1"] + [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and a.address != "127.0.0.1"
    ]
    with (
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
    ):
        tcp.bind(("0.0.0.0", 0))
        tcp.listen(8)
        tcp.setblocking(False)
        udp.bind(("0.0.0.0", 0))
        udp.setblocking(False)
        tcp_port, udp_port = tcp.getsockname()[1], udp.getsockname()[1]
        code = (
            "import socket\nok = []\n"
            f"for host in {addresses!r}:\n"
            "    try:\n"
            f"        socket.create_connection((host, {tcp_port}), timeout=1).send(b'x')\n"
            "        ok.append(host)\n"
            "    except OSError:\n"
            "        pass\n"
            "    try:\n"
            f"        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', (host, {udp_port}))\n"
            "    except OSError:\n"
            "        pass\n"
            "print(ok)\nassert not ok\n"
        )
        result = run(code)
        time.sleep(0.2)
        with pytest.raises(BlockingIOError):
            tcp.accept()
        with pytest.raises(BlockingIOError):
            udp.recv(16)
    assert result.output in ("", "[]\n"), result


@pytest.mark.parametrize("family", [40, 17, 1])  # AF_VSOCK (the VM host), AF_PACKET, AF_UNIX
def test_other_socket_families_are_refused(family: int, hookless: None) -> None:
    result = run(
        f"import socket\nsocket.socket({family}, socket.SOCK_STREAM if {family} != 17 else socket.SOCK_RAW)"
    )
    assert not result.ok and "PermissionError" in result.error, result


# --- processes --------------------------------------------------------------------------------


def test_killing_the_parent_kills_the_tool_tree(tmp_path: Path) -> None:
    """SIGKILL the rollout process mid-call: nothing of the call survives, no temp dir stays."""
    pattern = os.path.join(tempfile.gettempdir(), "asyncrl-sandbox-*")
    dirs_before = set(glob.glob(pattern))
    parent_code = (
        "import asyncio, importlib, sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {os.path.dirname(sandbox.__file__)!r}]\n"
        f"sb = importlib.import_module({sandbox.__name__!r})\n"
        'code = \'import time\\nopen("marker", "w").write("x")\\ntime.sleep(60)\'\n'
        "asyncio.run(sb.run_python(code, sb.SandboxLimits(wall_time_s=60, cpu_time_s=60)))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 20
        tree: list[psutil.Process] = []
        while time.monotonic() < deadline and not any(_is_tool(p) for p in tree):
            time.sleep(0.05)
            tree = live_descendants(psutil.Process(parent.pid))
        assert any(_is_tool(p) for p in tree), f"the tool process never started: {tree}"
        time.sleep(0.3)  # let it write into its workdir
        parent.kill()
        parent.wait()
        survivors = _wait_until_gone(tree)
    finally:
        parent.kill()
    described = [(p.pid, p.cmdline()[:3]) for p in survivors]
    left = _clean_up(survivors, set(glob.glob(pattern)) - dirs_before)
    assert survivors == [] and left == [], f"outlived their parent: {described}, {left}"


def test_tool_runs_as_an_unprivileged_uid_on_the_host(mode: str, no_leftovers: None) -> None:
    async def main() -> tuple[ToolResult, list[int]]:
        call = asyncio.create_task(run_python("import time\ntime.sleep(1.5)", LIMITS))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            tools = [p for p in live_descendants() if _is_tool(p)]
            if tools:
                uids = list(tools[0].uids()) + list(tools[0].gids())
                return await call, uids
            await asyncio.sleep(0.05)
        raise AssertionError("the tool process never started")

    result, ids = asyncio.run(main())
    assert result.ok, result
    assert 0 not in ids, f"host uids/gids of the tool process: {ids}"
    if os.geteuid() == 0:
        assert ids == [65534] * 6


def test_no_capabilities_and_no_way_to_regain_them(hookless: None) -> None:
    code = (
        "import ctypes, os\n"
        "status = dict(line.split(':\\t') for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)\n"
        "print({k: status[k] for k in ('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs', 'Seccomp')})\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "results = {\n"
        "    'unshare_user': libc.unshare(0x10000000),\n"
        "    'unshare_mount': libc.unshare(0x00020000),\n"
        "    'mount_tmpfs': libc.mount(b'none', b'/sandbox', b'tmpfs', 0, None),\n"
        "    'chroot': libc.chroot(b'/usr'),\n"
        "    'setuid0': libc.setuid(0),\n"
        "    'setns': libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0),\n"
        "    'bpf': libc.syscall(321, 0, 0, 0),\n"
        "    'io_uring_setup': libc.syscall(425, 1, 0),\n"
        "    'keyctl': libc.syscall(250, 0, 0),\n"
        "    'userfaultfd': libc.syscall(323, 0),\n"
        "    'perf_event_open': libc.syscall(298, 0, 0, -1, -1, 0),\n"
        "}\n"
        "print(results)\n"
        "import resource\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_NPROC, (100, 100))\n"
        "    print('raised NPROC')\n"
        "except (ValueError, OSError):\n"
        "    pass\n"
        "assert all(v == -1 for v in results.values())\n"
    )
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers in this test are x86_64's")
    result = run(code)
    assert result.ok, result
    assert "'CapEff': '0000000000000000'" in result.output
    assert "'CapPrm': '0000000000000000'" in result.output
    assert "'CapBnd': '0000000000000000'" in result.output
    assert "'NoNewPrivs': '1'" in result.output and "'Seccomp': '2'" in result.output
    assert "raised NPROC" not in result.output


def test_without_seccomp_the_other_layers_still_hold(
    hookless: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """best_effort on a kernel without seccomp: no nested user namespace, no ptrace of init."""
    real = sandbox.isolation()
    if real.missing:
        pytest.skip(f"this machine lacks {real.describe_missing()}")
    fake = sandbox.Isolation(real.available - {"seccomp"}, {"seccomp": "test"})
    monkeypatch.setattr(sandbox, "isolation", lambda: fake)
    code = (
        "import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print([line.split()[1] for line in open('/proc/self/status') if line.startswith('Seccomp:')])\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER: ENOSPC (cap 0)
        "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH init: EPERM
        "os.kill(1, signal.SIGKILL)\n"  # ignored: init of its own PID namespace
        "print('still here')\n"
    )
    result = run(code, SandboxLimits(wall_time_s=10.0, isolation="best_effort"))
    assert result.ok, result
    assert result.output == "['0']\n-1 28\n-1 1\nstill here\n"


def test_fork_and_threads_are_bounded(mode: str, no_leftovers: None) -> None:
    code = (
        "import os, threading, time\nn = 0\n"
        "try:\n"
        "    for _ in range(20):\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "finally:\n"
        "    print(n, flush=True)\n"
    )
    result = run(code)
    assert not result.ok and result.output == "0\n", result
    thread = run("import threading\nthreading.Thread(target=print).start()")
    assert not thread.ok, thread


def test_host_processes_are_invisible_and_untouchable(
    mode: str, victim: subprocess.Popen, no_leftovers: None
) -> None:
    code = (
        "import os, signal\nfound = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        if b'fake-secret-5d2e' in open(f'/proc/{pid}/environ', 'rb').read():\n"
        "            found.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('found', found, flush=True)\n"
        f"os.kill({victim.pid}, signal.SIGKILL)\n"
    )
    result = run(code)
    assert not result.ok, result
    assert "fake-secret-5d2e" not in result.output and "found []" in result.output, result
    time.sleep(0.2)
    assert victim.poll() is None, "the tool killed a host process"


def test_ptrace_of_a_host_process_fails(hookless: None, victim: subprocess.Popen) -> None:
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"rc = libc.ptrace(16, {victim.pid}, 0, 0)\n"  # PTRACE_ATTACH
        "print(rc, ctypes.get_errno())\nassert rc == -1\n"
    )
    result = run(code)
    assert result.ok, result
    assert victim.poll() is None
    assert psutil.Process(victim.pid).status() != psutil.STATUS_TRACING_STOP


def test_a_timed_out_call_leaves_nothing_behind(mode: str, no_leftovers: None) -> None:
    """Wall-time kill: with setsid children (where forks worked) and a full workdir."""
    code = (
        "import os, time\n"
        "open('big', 'wb').write(b'x' * 2**20)\n"
        "try:\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        time.sleep(30)\n"
        "except OSError:\n"
        "    pass\n"
        "while True:\n"
        "    pass\n"
    )
    result = run(code, SandboxLimits(wall_time_s=1.0))
    assert result.timed_out, result


def test_only_stdio_is_inherited(hookless: None) -> None:
    result = run("import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))")
    assert result.ok, result
    assert result.output == "[0, 1, 2, 3]\n"  # 3: the listing's own fd


def test_rlimits_still_hold(mode: str) -> None:
    big = run("open('big', 'wb').write(b'x' * (9 * 2**20))")
    assert not big.ok and "File too large" in big.error, big
    memory = run("x = bytearray(2**30)")
    assert not memory.ok and "memory limit" in memory.error, memory


def test_sigkill_to_the_tool_is_reported(hookless: None) -> None:
    result = run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert not result.ok and result.error.startswith("killed by SIGKILL"), result
