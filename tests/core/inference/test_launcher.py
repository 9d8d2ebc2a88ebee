"""The SGLang launcher: the command it builds, and a real launch/stop of a process speaking the API.

SGLang itself needs CUDA, so the real launch runs ``core.inference.server``, which accepts
SGLang's launch flags and serves the same endpoints: the launcher, the process-group handling
and the health wait are exercised for real, with our server standing in for SGLang.
"""

from __future__ import annotations

import os
import sys

import pytest

from core.inference.api import GenerationRequest, SamplingParams
from core.inference.clients.sglang_client import SGLangClient
from core.inference.clients.sglang_launcher import SGLangLaunchSpec, build_command, launch
from core.training.distributed import free_port
from tests.core.inference.helpers import run

pytestmark = pytest.mark.integration


def test_build_command() -> None:
    spec = SGLangLaunchSpec(
        model_path="/models/qwen",
        host="0.0.0.0",
        port=30001,
        tp_size=4,
        mem_fraction_static=0.85,
        dtype="bfloat16",
        python_executable="/envs/sglang/bin/python",
        extra_args=["--context-length", "4096"],
    )
    assert build_command(spec) == [
        "/envs/sglang/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/models/qwen", "--host", "0.0.0.0", "--port", "30001",
        "--tp-size", "4", "--mem-fraction-static", "0.85", "--skip-tokenizer-init",
        "--dtype", "bfloat16", "--context-length", "4096",
    ]  # fmt: skip
    assert "--skip-tokenizer-init" not in build_command(
        SGLangLaunchSpec(model_path="m", skip_tokenizer_init=False)
    )


def test_launch_generate_stop(model_dir, tmp_path) -> None:
    spec = SGLangLaunchSpec(
        model_path=str(model_dir),
        port=free_port(),
        python_executable=sys.executable,
        module="core.inference.server",
        extra_args=["--torch-threads", "1"],
    )
    log = tmp_path / "server.log"
    with launch(spec, log, health_timeout_s=120, poll_s=0.2) as server:
        assert server.alive()
        sampling = SamplingParams(max_new_tokens=5, temperature=0.0)

        async def main():
            async with SGLangClient([server.address]) as client:
                return await client.agenerate(GenerationRequest([1, 5, 9], sampling))

        assert len(run(main()).output_ids) <= 5
        pid = server.proc.pid
    assert not server.alive()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone
    assert "serving" in log.read_text()


def test_launch_failure_reports_the_log_tail(tmp_path) -> None:
    """A server that dies before it is healthy (here: no such server module) is reported."""
    spec = SGLangLaunchSpec(
        model_path="m", port=free_port(), python_executable=sys.executable, module="no_such_server"
    )
    with pytest.raises(RuntimeError, match="exited with code 1") as info:
        launch(spec, tmp_path / "bad.log", health_timeout_s=60, poll_s=0.1)
    assert "No module named no_such_server" in str(info.value)
