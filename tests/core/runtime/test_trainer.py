"""The RL loop end to end on the tiny model: staleness bound, weight publishing, exact resume.

The resume tests run the real command line in a subprocess and ``kill -9`` it once a
checkpoint is committed, against a local folder and against s3:// on a real moto server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from core.config import load_config
from core.runtime.checkpointing import MARKER, CheckpointManager
from core.runtime.job import run_experiment
from tests.core.runtime.helpers import kill_a_server_after_the_first_step, servers_of

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
TINY = [
    "data.n_train=120",
    "data.n_test=16",
    "eval.n_problems=16",
    "eval.max_new_tokens=8",
    "sft.enabled=false",
    "rollout.batch_size=4",
    "algorithm.group_size=2",
    "sampling.max_new_tokens=8",
    "rollout.max_concurrent=16",
    "algorithm.overlong_buffer_len=4",
    "eval.every_n_steps=0",
    "checkpoint.every_n_steps=0",
]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# η=0 on our engine in the rollout worker. η=2 on two servers the run launches (SGLang's HTTP
# protocol, our server); one of them is killed with kill -9 after the first step: the run
# restarts it, its requests finish on the other, and no sample is lost or counted twice.
ENGINES = {0: [], 2: ["inference.engine=sglang", "inference.n_servers=2"]}


@pytest.mark.e2e
@pytest.mark.parametrize("eta", [0, 2])
def test_rl_run_respects_staleness_and_publishes(tmp_path: Path, eta: int) -> None:
    cfg = load_config(
        QUICKSTART,
        [
            *TINY,
            *ENGINES[eta],
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=t",
            f"rollout.max_staleness={eta}",
            "learner.total_steps=4",
            "eval.n_samples=2",
        ],
    )
    run_dir = tmp_path / "quickstart" / "t"
    killed: list[int] = []
    killer = threading.Thread(
        target=kill_a_server_after_the_first_step, args=(run_dir, 2, killed), daemon=True
    )
    if ENGINES[eta]:
        killer.start()
    summary = run_experiment(cfg)
    if ENGINES[eta]:
        killer.join()
        assert len(killed) == 1, "no server was killed mid-run"
        assert not servers_of(run_dir)  # both stopped with the run
        logs = [log.read_text() for log in sorted((run_dir / "servers").glob("server-*.log"))]
        starts = sorted(len(re.findall(r"serving \S+ on http://", text)) for text in logs)
        assert starts == [1, 2]  # the killed one was started again, on its address
        for text in logs:  # and each server, the restarted one too, ended at version 4
            assert "weights updated to version 4" in re.split(r"serving \S+ on http://", text)[-1]
        assert [p.name for p in (run_dir / "weights").glob("v*")] == ["v000004"]
        counters = summary["rollout"]
        assert counters["consumed"] == 16 and counters["failed"] == 0
    # evals before and after RL, each with the task's metric and pass@k / mean@k
    evals = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 4]
    assert all(
        {"eval/direct_share", "eval/pass_at_1", "eval/pass_at_2", "eval/mean_at_2"} <= set(m)
        for m in evals
    )
    batches = read_jsonl(run_dir / "batches.jsonl")
    assert [b["step"] for b in batches] == [0, 1, 2, 3]
    assert [b["version"] for b in batches] == [1, 2, 3, 4]
    assert all(len(b["sample_ids"]) == 4 for b in batches)
    assert max(s for b in batches for s in b["staleness"]) <= eta
    if eta == 0:
        assert {s for b in batches for s in b["staleness"]} == {0}
    # the engine serves what the learner published
    assert summary["rollout"]["version"] == summary["version"] == 4
    assert summary["max_staleness_seen"] <= eta
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    steps = [m for m in metrics if "learner/busy_fraction" in m]
    assert len(steps) == 4 and all(0 < m["learner/busy_fraction"] <= 1 for m in steps)
    assert all(m["staleness/max"] <= eta for m in steps)
    # the rollout side per step: in flight, and what the in-process engine did (servers: no)
    assert all(m["rollout/groups_in_flight"] >= 0 for m in steps)
    if not ENGINES[eta]:
        assert all(0 < m["rollout/engine_busy_frac"] <= 1 for m in steps)
        assert all(m["rollout/prefill_tokens"] > 0 for m in steps)  # every step's prompts
        assert summary["rollout"]["engine"]["tokens_generated"] > 0
    else:
        assert not any("rollout/engine_busy_frac" in m for m in steps)
    # the final model is a loadable HF folder and differs from the start
    from core.models import load_model

    start, final = load_model(run_dir / "model_init"), load_model(summary["final_model_dir"])
    assert any((a - b).abs().max() > 0 for a, b in zip(start.parameters(), final.parameters()))
    assert CheckpointManager(summary["checkpoint_url"]).latest() == 4
    # the timeline: one record per step, in order, each step's parts within its slot
    timeline = json.loads((run_dir / "timeline" / "timeline.json").read_text())
    records = timeline["steps"]
    assert [r["version"] for r in records] == [1, 2, 3, 4]
    for record, after in zip(records, records[1:], strict=False):
        busy = record["wait_s"] + record["train_s"] + record["publish_s"]
        assert record["start"] + busy <= after["start"] + 0.05
    assert [r["staleness_max"] for r in records] == [max(b["staleness"]) for b in batches]
    assert {p["kind"] for p in timeline["pauses"]} == {"checkpoint", "eval"}
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(run_dir / "timeline" / "timeline.png").shape
    assert height > 300 and width > 600


@pytest.mark.e2e
def test_ppo_preset_trains_a_critic(tmp_path: Path) -> None:
    cfg = load_config(
        QUICKSTART,
        [
            *TINY,
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=p",
            "algorithm=ppo",
            "algorithm.group_size=2",
            "learner.total_steps=2",
            "eval.at_start=false",  # and no evaluation before RL
        ],
    )
    summary = run_experiment(cfg)
    metrics = read_jsonl(tmp_path / "quickstart" / "p" / "metrics.jsonl")
    assert len([m for m in metrics if "critic/loss" in m]) == 2
    assert [m["step"] for m in metrics if "eval/accuracy" in m] == [2]  # the final one only
    assert summary["accuracy_before"] is None and [e["version"] for e in summary["evals"]] == [2]
    assert summary["accuracy_after"] == summary["evals"][0]["accuracy"]


def test_checkpoint_manager_ignores_torn_checkpoints(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path / "ckpt"), keep_last=2)
    assert manager.latest() is None
    for step in (1, 2, 3):
        manager.commit(step, {"version": step})
    assert manager.committed_steps() == [2, 3]  # keep_last
    torn = Path(manager.path(4))
    torn.mkdir(parents=True)
    (torn / "recover.json").write_text("{}")  # no marker: a crash mid-write
    assert manager.latest() == 3
    assert manager.load_recover(3) == {"version": 3}


def _commit_real_checkpoint(manager: CheckpointManager, step: int) -> Path:
    """A small but real checkpoint: DCP learner state, a HF folder, recover.json, the marker."""
    import torch
    from safetensors.torch import save_file

    from core.training.checkpoint import save_state

    base = Path(manager.path(step))
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    save_state(str(base / "learner" / "policy"), model, optimizer, scheduler, {"step": step})
    (base / "hf").mkdir(parents=True)
    (base / "hf" / "config.json").write_text("{}")
    save_file(dict(model.state_dict()), str(base / "hf" / "model.safetensors"))
    manager.commit(step, {"version": step, "rollout": {}, "rng": {}, "config_hash": "h"})
    return base


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-8])  # the tail of the data, as a cut-off upload


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda b: (b / "recover.json").write_text("{not json"), "recover.json unreadable"),
        (lambda b: (b / "recover.json").write_text("{}"), "recover.json lacks"),
        (lambda b: (b / "learner/policy/.metadata").unlink(), "no .metadata"),
        (lambda b: (b / "learner/policy/.metadata").write_bytes(b"junk"), ".metadata unreadable"),
        (lambda b: _truncate(next((b / "learner/policy").glob("*.distcp"))), "truncated"),
        (lambda b: _truncate(b / "hf/model.safetensors"), "model.safetensors is truncated"),
        (lambda b: (b / "hf/model.safetensors").unlink(), "model.safetensors unreadable"),
    ],
    ids=["recover-garbage", "recover-empty", "no-metadata", "bad-metadata", "short-shard",
         "short-weights", "no-weights"],
)  # fmt: skip
def test_checkpoint_problems_name_what_is_corrupt(
    tmp_path: Path, damage: Any, expected: str
) -> None:
    manager = CheckpointManager(str(tmp_path / "ckpt"), keep_last=2)
    base = _commit_real_checkpoint(manager, 3)
    assert manager.problems(3) == []
    damage(base)
    problems = manager.problems(3)
    assert len(problems) == 1 and expected in problems[0], problems


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "asyncrl"
    # Its own process group: the kill below takes the whole job (workers, Prefect's temporary
    # server) down at once, as a crashed node would, and leaves nothing running.
    log = tempfile.TemporaryFile("w+")  # not a pipe: one nobody reads could fill and block it
    proc = subprocess.Popen(
        [str(exe), "run", str(QUICKSTART), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _stderr(proc: subprocess.Popen) -> str:
    proc.log.seek(0)  # type: ignore[attr-defined]
    return proc.log.read()  # type: ignore[attr-defined]


def _resume_case(
    fileroot: str, ckpt_dir: Any, env: dict[str, str], trial: str, extra: tuple[str, ...] = ()
) -> str:
    """4 steps with a kill -9 after the step-2 checkpoint, then recover=auto; returns its log.

    The kill lands a poll period after step 2's marker appears, and a tiny step can commit
    step 3 in that time: callers read the step resumed from with `_resumed_step`.
    """
    args = [
        *TINY,
        *extra,
        f"cluster.fileroot={fileroot}",
        f"experiment.trial={trial}",
        "rollout.max_staleness=0",
        "learner.total_steps=4",
        "checkpoint.every_n_steps=1",
        "checkpoint.keep_last=3",
    ]
    env = {**env, "COLUMNS": "400"}  # rich wraps log lines at the terminal width
    first = _cli(args, env)
    deadline = time.monotonic() + 240
    while not ckpt_dir("step-000002"):
        assert first.poll() is None, f"run ended before the kill: {_stderr(first)[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    if extra:  # the run's inference server died with it (parent-death signal), port released
        _wait_closed(_server_ports(fileroot, trial))
    second = _cli([*args, "checkpoint.recover=auto"], env)
    assert second.wait(timeout=300) == 0, _stderr(second)[-3000:]
    log = _stderr(second)
    assert "resuming from" in log
    assert "differs" not in log  # recover=auto does not change what the run computes
    return log


@pytest.mark.e2e
def test_kill_and_resume_local_matches_straight_run(
    tmp_path: Path, prefect_env: dict[str, str]
) -> None:
    env = {**prefect_env, "COLUMNS": "200"}
    straight = load_config(
        QUICKSTART,
        [
            *TINY,
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=straight",
            "rollout.max_staleness=0",
            "learner.total_steps=4",
        ],
    )
    run_experiment(straight)
    reference = read_jsonl(tmp_path / "quickstart" / "straight" / "batches.jsonl")

    ckpt = tmp_path / "quickstart" / "resumed" / "checkpoints"
    log = _resume_case(str(tmp_path), lambda name: (ckpt / name / MARKER).exists(), env, "resumed")
    resumed_rows = read_jsonl(tmp_path / "quickstart" / "resumed" / "batches.jsonl")
    assert [row["step"] for row in resumed_rows] == [0, 1, 2, 3]  # no step twice
    by_step = {row["step"]: row for row in resumed_rows}
    assert [by_step[s]["sample_ids"] for s in range(4)] == [r["sample_ids"] for r in reference]
    assert [by_step[s]["version"] for s in range(4)] == [1, 2, 3, 4]
    summary = json.loads((tmp_path / "quickstart" / "resumed" / "summary.json").read_text())
    # only the steps after the checkpoint it resumed from ran again
    assert summary["version"] == 4 and summary["steps"] == 4 - _resumed_step(log)


def _resumed_step(log: str) -> int:
    """The checkpoint step a `recover=auto` run says it resumed from (2 or 3 here)."""
    found = re.search(r"resuming from \S*step-(\d+) \(version (\d+)\)", log)
    assert found, log[-3000:]
    step, version = int(found[1]), int(found[2])
    assert step == version and step in (2, 3), found[0]
    return step


def _server_ports(fileroot: str, trial: str) -> list[int]:
    """The ports the run's launched servers logged (their logs stay local)."""
    from core.storage import join, local_path

    logs = local_path(join(fileroot, "quickstart", trial, "servers")).glob("server-*.log")
    pattern = r"serving \S+ on http://127.0.0.1:(\d+)"
    return [int(m[1]) for log in logs for m in re.finditer(pattern, log.read_text())]


def _wait_closed(ports: list[int], timeout_s: float = 30.0) -> None:
    assert ports
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                break
            assert time.monotonic() < deadline, f"a server still listens on {port}"
            time.sleep(0.2)


@pytest.mark.integration
def test_kill_and_resume_on_s3(
    tmp_path: Path,
    s3_endpoint: str,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    prefect_env: dict[str, str],
) -> None:
    import fsspec

    env = {
        **prefect_env,
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": s3_storage_options["key"],
        "AWS_SECRET_ACCESS_KEY": s3_storage_options["secret"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    fs = fsspec.filesystem("s3", **s3_storage_options)
    base = f"{s3_bucket}/runs/quickstart/s3run/checkpoints"

    def committed(name: str) -> bool:
        fs.invalidate_cache()
        return fs.exists(f"{base}/{name}/{MARKER}")

    # On servers the run launches, which get every version through S3 (no shared folder).
    fileroot = f"s3://{s3_bucket}/runs"
    log = _resume_case(fileroot, committed, env, "s3run", ("inference.engine=sglang",))
    summary = json.loads(fs.cat(f"{s3_bucket}/runs/quickstart/s3run/summary.json"))
    assert summary["version"] == 4 and summary["steps"] == 4 - _resumed_step(log)
    _wait_closed(_server_ports(fileroot, "s3run"))
    weights = f"{s3_bucket}/runs/quickstart/s3run/weights"
    fs.invalidate_cache()
    # the learner's initial policy (its KL reference, for any node) and the last version only
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(weights)] == ["start", "v000004"]
    assert fs.exists(f"{base}/step-000004/hf/model.safetensors")
    assert fs.exists(f"{base}/step-000004/learner/policy/.metadata")
    rows = [
        json.loads(line)
        for line in fs.cat(f"{s3_bucket}/runs/quickstart/s3run/batches.jsonl").splitlines()
    ]
    assert [row["step"] for row in rows] == [0, 1, 2, 3]  # the earlier rows fetched, none twice


@pytest.mark.integration
def test_two_node_ray_cluster_places_servers_and_learners_apart(
    tmp_path: Path,
    s3_endpoint: str,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real two-node Ray cluster (two raylets: ray.cluster_utils) the run attaches to: two
    inference servers it launches on the node labelled ``inference``, two FSDP2 learner ranks on
    the node labelled ``training``, fileroot s3:// on moto; each version goes from the learner's
    rank 0 to the servers by broadcast (SGLang's distributed update), nothing by shared disk."""
    import fsspec
    import ray
    from ray.cluster_utils import Cluster

    from core.inference.clients.http_client import API_KEY_ENV

    # Ray's nodes, their workers and the servers inherit this process's environment.
    for name, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": s3_storage_options["key"],
        "AWS_SECRET_ACCESS_KEY": s3_storage_options["secret"],
        "AWS_DEFAULT_REGION": "us-east-1",
        API_KEY_ENV: "two-node-test-key",
    }.items():
        monkeypatch.setenv(name, value)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 3, "resources": {"inference": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, resources={"training": 1})
    cfg = load_config(
        QUICKSTART,
        [
            *TINY,
            f"cluster.fileroot=s3://{s3_bucket}/runs",
            "experiment.trial=ray",
            "scheduler.type=ray",
            f"cluster.ray_address={cluster.address}",
            "learner.n_ranks=2",
            "scheduler.learner_cpus=2",
            "scheduler.learner_resource=training",
            "inference.engine=sglang",
            "inference.n_servers=2",
            "inference.weight_sync=distributed",
            "scheduler.server_resource=inference",
            "rollout.max_staleness=1",
            "learner.total_steps=3",
        ],
    )
    try:
        summary = run_experiment(cfg)
        labels = {n["NodeID"]: set(n["Resources"]) & {"inference", "training"} for n in ray.nodes()}
        deadline = time.monotonic() + 20  # ray.kill releases an actor's CPUs asynchronously
        while (free := ray.available_resources()).get("CPU") != 5 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert free.get("CPU") == 5  # every actor and the placement group gave their CPUs back
    assert summary["version"] == 3 == summary["rollout"]["version"]
    fs = fsspec.filesystem("s3", **s3_storage_options)
    placement = json.loads(fs.cat(f"{s3_bucket}/runs/quickstart/ray/placement.json"))
    assert [labels[node] for node in placement["learners"]] == [{"training"}] * 2
    assert [labels[s["node_id"]] for s in placement["servers"]] == [{"inference"}] * 2
    rows = [
        json.loads(line)
        for line in fs.cat(f"{s3_bucket}/runs/quickstart/ray/batches.jsonl").splitlines()
    ]
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert max(s for row in rows for s in row["staleness"]) <= 1


@pytest.mark.e2e
def test_resume_keeps_the_initial_policy_as_kl_reference(tmp_path: Path) -> None:
    """KL to the reference after a resume is the KL an uninterrupted run sees: the reference
    stays the initial policy (it used to become the checkpointed policy, so KL restarted at 0)."""
    common = [
        *TINY,
        f"cluster.fileroot={tmp_path}",
        "rollout.max_staleness=0",
        "algorithm.kl_coef=0.05",
        "algorithm.lr=1e-3",
        "rollout.reward_fn=tests.experiments.rewards:digit_share",
        "checkpoint.every_n_steps=1",
    ]
    run_experiment(
        load_config(QUICKSTART, [*common, "experiment.trial=straight", "learner.total_steps=4"])
    )
    run_experiment(
        load_config(QUICKSTART, [*common, "experiment.trial=resumed", "learner.total_steps=2"])
    )
    resumed = load_config(
        QUICKSTART,
        [*common, "experiment.trial=resumed", "learner.total_steps=4", "checkpoint.recover=auto"],
    )
    assert run_experiment(resumed)["steps"] == 2  # steps 2 and 3, after resuming at version 2

    def per_step(trial: str) -> dict[int, dict[str, Any]]:
        rows = read_jsonl(tmp_path / "quickstart" / trial / "metrics.jsonl")
        return {row["step"]: row for row in rows if "actor/kl" in row}

    straight, again = per_step("straight"), per_step("resumed")
    assert sorted(again) == [0, 1, 2, 3]
    assert straight[3]["actor/kl"] > 1e-4  # the policy moved away from the reference
    for step in (2, 3):
        assert again[step]["reward/mean"] == pytest.approx(straight[step]["reward/mean"], abs=1e-6)
        assert again[step]["actor/kl"] == pytest.approx(straight[step]["actor/kl"], rel=1e-3)


@pytest.mark.e2e
def test_resume_skips_a_corrupt_latest_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A corrupt newest checkpoint is skipped with the reason logged; the run resumes from the
    one before it, and batches.jsonl holds each step once."""
    common = [
        *TINY,
        f"cluster.fileroot={tmp_path}",
        "experiment.trial=t",
        "rollout.max_staleness=0",
        "checkpoint.every_n_steps=1",
        "checkpoint.keep_last=3",
    ]
    run_experiment(load_config(QUICKSTART, [*common, "learner.total_steps=2"]))
    ckpt = tmp_path / "quickstart" / "t" / "checkpoints"
    assert (ckpt / "step-000002" / MARKER).exists()
    shard = next((ckpt / "step-000002" / "learner" / "policy").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-64])  # an upload cut short
    # resumed on a server the run launches: from the checkpoint's weights, at its version
    resumed = load_config(
        QUICKSTART,
        [*common, "learner.total_steps=3", "checkpoint.recover=auto", "inference.engine=sglang"],
    )
    with caplog.at_level("INFO", logger="core.runtime.trainer"):
        summary = run_experiment(resumed)
    assert summary["steps"] == 2 and summary["version"] == 3  # steps 1 and 2 from version 1
    log = (tmp_path / "quickstart" / "t" / "servers" / "server-0.log").read_text()
    assert "step-000001" in log  # launched from checkpoint 1
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and "step-000002" in skipped[0] and "truncated" in skipped[0]
    rows = read_jsonl(tmp_path / "quickstart" / "t" / "batches.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2]
    # η=0 admits only tokens of the current version: the server served version 1 from the start
    assert {s for row in rows for s in row["staleness"]} == {0}
