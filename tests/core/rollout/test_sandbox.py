"""The Python tool sandbox: limits, isolation (network, filesystem, environment, processes)."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
import uuid
from pathlib import Path

import psutil
import pytest

from core.rollout import sandbox
from core.rollout.sandbox import SandboxLimits, ToolResult, netns_available, run_python

pytestmark = pytest.mark.unit

FAST = SandboxLimits(wall_time_s=1.0)


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
    start = time.monotonic()
    result = run("import os\nprint(os.getpid(), flush=True)\nwhile True:\n    pass")
    assert time.monotonic() - start < FAST.wall_time_s + 2.0
    assert result.timed_out and not result.ok
    assert result.error == "timeout after 1.0 s"
    pid = int(result.output.split()[0])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


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
        f"import os\nos.chdir('/tmp')\nopen({shared.name!r}, 'w')",
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
    for code in attempts:
        result = run(code)
        assert not result.ok and "sandbox: " in result.error, (code, result)
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


def test_temp_dir_is_removed_afterwards() -> None:
    result = run("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())")
    assert result.ok, result.error
    workdir = result.output.strip()
    assert workdir.startswith("/") and not os.path.exists(workdir)


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
    monkeypatch.setattr(sandbox, "namespace_flags", lambda: 0)  # as on a machine without namespaces
    result = run("import os, socket\nprint(os.readlink('/proc/self/ns/net'))\nsocket.socket()")
    assert result.output.strip() == os.readlink("/proc/self/ns/net")
    assert not result.ok and "sandbox: socket.__new__" in result.error


def test_failed_namespace_setup_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "namespace_flags", lambda: 1 << 31)  # unshare() rejects it
    result = run("print('must not run')")
    assert not result.ok and result.error.startswith("sandbox setup failed")
    assert result.output == ""


def test_cancelled_call_kills_its_process() -> None:
    before = {p.pid for p in _live_children()}  # e.g. a session-wide moto_server

    async def cancel_midway() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                run_python("import time\ntime.sleep(60)", SandboxLimits(wall_time_s=30)), 0.5
            )

    asyncio.run(cancel_midway())
    deadline = time.monotonic() + 2.0
    while (
        alive := [p for p in _live_children() if p.pid not in before]
    ) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL was sent on cancellation; give the kernel a moment
    assert alive == []


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive
