"""For tests that start a real server process: wait until its health URL answers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx


def wait_healthy(
    url: str,
    proc: subprocess.Popen,
    output: Callable[[], str],
    *,
    timeout_s: float = 120.0,
    interval_s: float = 0.3,
) -> None:
    """Poll ``url`` until it answers 200; fail with the server's ``output()`` if it exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"server exited with {proc.returncode}: {output()[-3000:]}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not become healthy in {timeout_s:.0f} s"
        time.sleep(interval_s)
