"""The Python tool sandbox: limits, isolation (network, filesystem, environment, processes)."""

from __future__ import annotations

import asyncio
import glob
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from core.sandbox import Isolation, SandboxLimits, ToolResult, netns_available, run_python
from core.sandbox import kernel as sandbox_kernel
from core.sandbox import run as sandbox
from core.sandbox.kernel import FEATURES, seccomp_program
from tests.processes import live_descendants

pytestmark = pytest.mark.unit

FAST = SandboxLimits(wall_time_s=1.0)
NOTHING = Isolation(frozenset(), dict.fromkeys(FEATURES, "test: pretend the kernel has none"))


def run(code: str, limits: SandboxLimits = FAST) -> ToolResult:
    return asyncio.run(run_python(code, limits))


def test_prints_output() -> None:
    result = run("import json, math\nprint(json.dumps({'x': math.factorial(5)}))")
    assert result.ok, result.error
    assert result.output == '{"x": 120}\n'
    assert result.error == "" and not result.timed_out and result.wall_s > 0


def test_user_errors_are_results_with_a_short_reason() -> None:
    result = run("print('before')\n1/0")
    assert not result.ok and result.output == "before\n"
    assert result.error == "exit status 1: ZeroDivisionError: division by zero"
    assert run("def f(:").error.startswith("exit status 1: SyntaxError")
    assert run("import sys; sys.exit(3)").error.startswith("exit status 3")


def test_common_stdlib_still_works() -> None:
    code = (
        "import asyncio, collections, fractions, statistics, subprocess, tempfile\n"
        "asyncio.run(asyncio.sleep(0)); print(fractions.Fraction(1, 3) * 3)"
    )
    result = run(code)
    assert result.ok, result.error
    assert result.output == "1\n"


def test_infinite_loop_is_killed_at_the_wall_time_limit() -> None:
    before = {p.pid for p in live_descendants()}
    start = time.monotonic()
    result = run("print('started', flush=True)\nwhile True:\n    pass")
    assert time.monotonic() - start < FAST.wall_time_s + 2.0
    assert result.timed_out and not result.ok
    assert result.error == "timeout after 1.0 s" and result.output == "started\n"
    assert _wait_for_no_new_children(before) == []


def test_cpu_time_limit() -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_time_s=10.0, cpu_time_s=1))
    assert not result.ok and not result.timed_out
    assert result.error == "cpu time limit (1 s)"


@pytest.mark.parametrize(
    "code", ["bytearray(2**33)", "x = []\nwhile True:\n    x.append(bytearray(2**20))"]
)
def test_memory_limit(code: str) -> None:
    result = run(code, SandboxLimits(wall_time_s=10.0, memory_mb=128))
    assert not result.ok and not result.timed_out
    assert result.error.startswith("memory limit (128 MB)")


def test_network_is_blocked_and_nothing_connects() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        port = server.getsockname()[1]
        attempts = [
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
            f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))",
            f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('127.0.0.1', {port}))",
            "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)",
        ]
        for code in attempts:
            result = run(code)
            assert not result.ok and "sandbox: " in result.error, (code, result)
        with pytest.raises(BlockingIOError):
            server.accept()


def test_own_network_namespace_when_the_kernel_allows_it() -> None:
    if not netns_available():
        pytest.skip("no network namespaces here: only the audit hook blocks the network")
    result = run(
        "import os, socket\nprint(os.readlink('/proc/self/ns/net'), socket.if_nameindex())"
    )
    assert result.ok, result.error
    namespace, interfaces = result.output.split(" ", 1)
    assert namespace != os.readlink("/proc/self/ns/net")
    assert interfaces.strip() == "[(1, 'lo')]"


def test_cannot_write_outside_its_dir_but_can_inside(tmp_path: Path) -> None:
    owned = tmp_path / "owned.txt"
    shared = Path("/tmp") / f"sandbox-escape-{uuid.uuid4().hex}"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    attempts = [
        f"open({str(owned)!r}, 'w').write('x')",
        f"open({str(shared)!r}, 'a').write('x')",
        f"import os\nos.close(os.open({str(shared)!r}, os.O_WRONLY | os.O_CREAT))",
        f"import pathlib\npathlib.Path({str(owned)!r}).write_text('x')",
        f"import os\nos.chdir('/usr')\nopen({shared.name!r}, 'w')",
        f"open('../../../..' + {str(shared)!r}, 'w')",
        f"import os\nos.mkdir({str(shared)!r})",
        f"import os\nos.remove({str(victim)!r})",
        f"import os\nos.rename({str(victim)!r}, 'stolen.txt')",
        f"import os\nos.chmod({str(victim)!r}, 0o777)",
        f"import os\nos.symlink({str(tmp_path)!r}, 'link')\nopen('link/owned.txt', 'w')",
        f"import os\nos.link({str(victim)!r}, 'hard')\nopen('hard', 'w')",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\nos.open('owned.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        f"import sqlite3\nsqlite3.connect({str(shared)!r})",
    ]
    for code in attempts:  # the audit hook refuses, or the path is not in the tool's view
        result = run(code)
        assert not result.ok, (code, result)
        assert "sandbox: " in result.error or "No such file" in result.error, (code, result)
    assert not owned.exists() and not shared.exists()
    assert victim.read_text() == "keep me" and oct(victim.stat().st_mode)[-3:] != "777"

    inside = run(
        "import os\nopen(os.devnull, 'w').write('x')\nos.mkdir('d')\nopen('d/f.txt', 'w').write('hi')\nos.rename('d/f.txt', 'g.txt')\n"
        "print(open('g.txt').read(), sorted(os.listdir('.')))\nos.remove('g.txt')"
    )
    assert inside.ok, inside.error
    assert inside.output == "hi ['d', 'g.txt']\n"


def test_file_size_limit() -> None:
    result = run("open('big', 'wb').write(b'x' * (2 * 2**20))", SandboxLimits(max_file_mb=1))
    assert not result.ok and "File too large" in result.error


def test_environment_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-8c1f")
    result = run("import os\nprint(dict(os.environ))\nprint(os.environ['HOME'] == os.getcwd())")
    assert result.ok, result.error
    assert "fake-secret-8c1f" not in result.output and "AWS_" not in result.output
    assert result.output.endswith("True\n")
    parent = run("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert not parent.ok and "fake-secret-8c1f" not in parent.output


def test_workdir_is_a_private_tmpfs_that_leaves_nothing_on_the_host() -> None:
    if "mount-namespace" not in sandbox.isolation().available:
        pytest.skip("no mount namespace here")
    pattern = os.path.join(tempfile.gettempdir(), "asyncrl-sandbox-*")
    before = set(glob.glob(pattern))
    result = run(
        "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd(), os.environ['TMPDIR'])\n"
        "print([line.split()[2] for line in open('/proc/self/mounts') if line.split()[1] == os.getcwd()])"
    )
    assert result.ok, result.error
    assert result.output == "/sandbox /sandbox\n['tmpfs']\n"
    assert set(glob.glob(pattern)) <= before


def test_host_temp_dir_is_removed_afterwards_without_a_mount_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without its own root, the tool runs as the caller: uid 65534 might not reach the
    # interpreter (here under /root).
    lacking = {"mount-namespace": "test", "unprivileged-uid": "test"}
    fake = Isolation(sandbox.isolation().available - set(lacking), lacking)
    monkeypatch.setattr(sandbox, "isolation", lambda: fake)
    limits = SandboxLimits(wall_time_s=1.0, isolation="best_effort")
    result = run("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())", limits)
    assert result.ok, result.error
    workdir = result.output.strip()
    assert "asyncrl-sandbox-" in workdir and not os.path.exists(workdir)


def test_output_is_truncated_with_a_marker() -> None:
    result = run("print('x' * 100_000)", SandboxLimits(max_output_bytes=100))
    assert result.ok, result.error
    assert result.output.startswith("x" * 100) and not result.output.startswith("x" * 101)
    assert re.search(r"\[truncated 99901 bytes\]$", result.output)


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.fork()",
        "import subprocess\nsubprocess.run(['echo', 'hi'])",
        "import os\nos.system('echo hi')",
        "import os\nos.posix_spawn('/bin/echo', ['echo', 'hi'], {})",
        "import os\nos.execv('/bin/echo', ['echo', 'hi'])",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
        "import os, signal\nos.kill(os.getppid(), signal.SIGTERM)",
        "import ctypes",
    ],
)
def test_processes_and_ctypes_are_blocked(code: str) -> None:
    result = run(code)
    assert not result.ok and "sandbox: " in result.error, result
    assert "hi" not in result.output


def test_concurrent_runs_are_independent() -> None:
    async def many() -> list[ToolResult]:
        return await asyncio.gather(*(run_python(f"print({i} * 2)", FAST) for i in range(4)))

    assert [r.output for r in asyncio.run(many())] == ["0\n", "2\n", "4\n", "6\n"]


def test_audit_hook_alone_blocks_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "isolation", lambda: NOTHING)  # as on a machine without a jail
    limits = SandboxLimits(wall_time_s=1.0, isolation="best_effort")
    result = run(
        "import os, socket\nprint(os.readlink('/proc/self/ns/net'))\nsocket.socket()", limits
    )
    assert result.output.strip() == os.readlink("/proc/self/ns/net")
    assert not result.ok and "sandbox: socket.__new__" in result.error


def test_failed_jail_setup_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    if "mount-namespace" not in sandbox.isolation().available:
        pytest.skip("no mount namespace here")
    missing = {"kind": "dir", "path": f"/nonexistent-{uuid.uuid4().hex}"}
    view = sandbox._view()
    monkeypatch.setattr(sandbox, "_view", lambda: (*view, missing))
    result = run("print('must not run')")
    assert not result.ok and result.error.startswith("sandbox setup failed: mount-namespace: ")
    assert result.output == ""


def test_strict_mode_refuses_and_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    real = sandbox.isolation()
    fake = Isolation(real.available - {"seccomp"}, {"seccomp": "no seccomp here (test)"})
    monkeypatch.setattr(sandbox, "isolation", lambda: fake)
    marker = tmp_path / "ran"
    result = run(f"open({str(marker)!r}, 'w')")
    assert not result.ok and not marker.exists() and result.output == ""
    assert result.error == (
        "sandbox refused to run tool code: this machine lacks seccomp (no seccomp here (test)); "
        "set tools.sandbox=best_effort to run it with less isolation"
    )
    assert "refusing to run tool code" in caplog.text


def test_best_effort_runs_with_what_exists_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = sandbox.isolation()
    fake = Isolation(real.available - {"seccomp"}, {"seccomp": "test-only reason"})
    monkeypatch.setattr(sandbox, "isolation", lambda: fake)
    sandbox._warn_once.cache_clear()
    limits = SandboxLimits(wall_time_s=2.0, isolation="best_effort")
    for _ in range(2):
        result = run("print(open('/proc/self/status').read().count('Seccomp:\\t0'))", limits)
        assert result.ok and result.output == "1\n", result
    assert caplog.text.count("running tool code without seccomp (test-only reason)") == 1


def test_off_linux_strict_refuses_and_best_effort_runs_without_a_jail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox.sys, "platform", "darwin")  # as on a developer's Mac
    monkeypatch.setattr(sandbox, "isolation", sandbox.isolation.__wrapped__)  # not the cache
    refused = run("print(1)")
    assert not refused.ok and "seccomp (not Linux (darwin))" in refused.error
    limits = SandboxLimits(wall_time_s=2.0, isolation="best_effort")
    result = run("import os\nprint(os.getcwd())\nimport socket\nsocket.socket()", limits)
    assert "asyncrl-sandbox-" in result.output and "sandbox: socket.__new__" in result.error


def test_isolation_modes_are_validated() -> None:
    with pytest.raises(ValueError, match="isolation must be one of"):
        SandboxLimits(isolation="lenient")


def test_the_probe_accounts_for_every_feature() -> None:
    found = sandbox.isolation()
    assert found.available.isdisjoint(found.missing)
    assert found.available | set(found.missing) == set(FEATURES)


def test_probe_does_without_the_view_when_the_interpreter_cannot_start_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def probe(want: set[str]) -> tuple[set[str], dict[str, str]]:
        if "mount-namespace" in want:
            return set(), dict.fromkeys(want, "tool interpreter did not start: EACCES")
        return want - {"seccomp"}, {"seccomp": "no seccomp (test)"}

    monkeypatch.setattr(sandbox, "_probe_once", probe)
    found = sandbox.isolation.__wrapped__()
    assert found.available == set(FEATURES) - {"mount-namespace", "seccomp"}
    assert found.missing == {
        "mount-namespace": "tool interpreter did not start: EACCES",
        "seccomp": "no seccomp (test)",
    }


NON_ROOT_CALLER = """
import asyncio, sys
sys.path.insert(0, {root!r})
from core.sandbox import SandboxLimits, isolation, run_python
code = (
    "import os\\nprint(open('/proc/self/uid_map').read().split(), os.getcwd())\\n"
    "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')])\\n"
    "open('/etc/shadow')"
)
print(sorted(isolation().missing))
result = asyncio.run(run_python(code, SandboxLimits(wall_time_s=5.0)))
print(result.output, result.error)
"""


def test_a_non_root_caller_gets_the_same_jail_through_a_user_namespace() -> None:
    """uid 65534 inside maps to the caller's own uid; nothing else differs."""
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.path.exists(python):
        pytest.skip("needs root (to switch to a test uid) and a world-readable /usr/bin/python3")
    root = str(Path(__file__).resolve().parents[3])
    probe = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info >= (3, 11))"],
        capture_output=True,
        text=True,
        user=4321,
        group=4321,
        extra_groups=[],
    )
    if probe.stdout.strip() != "True" or not all(
        os.stat(p).st_mode & 0o005 == 0o005 for p in Path(root, "core", "rollout").parents
    ):
        pytest.skip("the test uid cannot run this checkout with /usr/bin/python3 (>= 3.11)")
    proc = subprocess.run(
        [python, "-I", "-c", NON_ROOT_CALLER.format(root=root)],
        capture_output=True,
        text=True,
        user=4321,
        group=4321,
        extra_groups=[],
        cwd="/",
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[]", proc.stdout  # every feature, as for root
    assert lines[1] == "['65534', '4321', '1'] /sandbox", proc.stdout
    assert lines[2] == "['0000000000000000']", proc.stdout
    assert "No such file or directory: '/etc/shadow'" in proc.stdout


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_filter_decisions(machine: str) -> None:
    prog = seccomp_program(machine)
    assert len(prog) < 4096
    arch, nr = sandbox_kernel._AUDIT_ARCH[machine], sandbox_kernel.SYSCALLS[machine]
    allow, eperm, enosys = 0x7FFF0000, 0x00050001, 0x00050026
    cases = [
        (nr["socket"], arch, (2, 1), allow),  # AF_INET
        (nr["socket"], arch, (10, 2), allow),  # AF_INET6
        (nr["socket"], arch, (16, 3), allow),  # AF_NETLINK
        (nr["socket"], arch, (1, 1), eperm),  # AF_UNIX
        (nr["socket"], arch, (40, 1), eperm),  # AF_VSOCK
        (nr["socket"], arch, (17, 3), eperm),  # AF_PACKET
        (nr["clone"], arch, (17,), allow),  # fork: SIGCHLD
        (nr["clone"], arch, (0x10000000 | 17,), eperm),  # CLONE_NEWUSER
        (nr["clone3"], arch, (), enosys),
        (nr["ioctl"], arch, (1, 0x5412), eperm),  # TIOCSTI
        (nr["ioctl"], arch, (1, 0x5401), allow),  # TCGETS
        (nr["mknodat"], arch, (), eperm),
        (nr["unshare"], arch, (), eperm),
        (nr["ptrace"], arch, (), eperm),
        (0, arch, (), allow),  # read / io_setup
        (63, arch, (), allow),
        (nr["socket"], 0x40000003, (2,), 0x80000000),  # another ABI: kill
    ]
    if machine == "x86_64":
        cases += [(nr["mknod"], arch, (), eperm), (nr["mknod"] | 0x40000000, arch, (), eperm)]
    for number, audit_arch, args, expected in cases:
        assert _run_bpf(prog, number, audit_arch, args) == expected, (machine, number, args)
    for name in set(nr) - {"socket", "clone", "clone3", "ioctl"}:
        assert _run_bpf(prog, nr[name], arch, ()) == eperm, name


def _run_bpf(prog: list[tuple[int, int, int, int]], nr: int, arch: int, args: tuple) -> int:
    """A classic-BPF interpreter for the few instructions the seccomp filter uses."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif code in (0x15, 0x35, 0x45):  # JEQ, JGE, JSET
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:  # BPF_RET
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def test_cancelled_call_kills_its_process() -> None:
    before = {p.pid for p in live_descendants()}  # e.g. a session-wide moto_server

    async def cancel_midway() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                run_python("import time\ntime.sleep(60)", SandboxLimits(wall_time_s=30)), 0.5
            )

    asyncio.run(cancel_midway())
    deadline = time.monotonic() + 2.0
    while (
        alive := [p for p in live_descendants() if p.pid not in before]
    ) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL was sent on cancellation; give the kernel a moment
    assert alive == []


def _wait_for_no_new_children(before: set[int], timeout: float = 2.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in live_descendants() if p.pid not in before]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return alive
