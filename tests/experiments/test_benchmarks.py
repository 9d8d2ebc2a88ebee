"""The benchmark scripts: their arithmetic, their argument checks, and one tiny real run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import mlflow
import pytest

from core.config import ConfigError
from core.models import create_pretrained
from core.runtime.metrics import MemorySink
from experiments.benchmarks import agent_latency as agl
from experiments.benchmarks import async_vs_sync as avs
from experiments.benchmarks import eta_accuracy as eta
from experiments.benchmarks import orchestration_overhead as ovh
from experiments.benchmarks import server_soak as soak
from experiments.benchmarks import vs_trl
from experiments.benchmarks._common import aggregate_seeds, mean_se


def _row(eta: int, threads: int, samples: float, gen: float, train: float, step: float) -> dict:
    return {
        "setting": f"eta{eta}-t{threads}",
        "eta": eta,
        "threads": threads,
        "steps": 4,
        "samples_per_s": samples,
        "gen_wait_s_per_step": gen,
        "train_s_per_step": train,
        "publish_s_per_step": 0.0,
        "step_s": step,
    }


def test_speedups_and_ceilings_come_from_the_best_sync_setting() -> None:
    rows = [
        _row(0, 1, 40.0, 1.0, 2.0, 3.0),
        _row(0, 2, 60.0, 0.8, 1.2, 2.0),
        _row(4, 1, 75.0, 0.1, 1.9, 2.0),
    ]
    report = avs.summarize("math", avs.TASKS["math"], rows, "model")
    assert report["best_sync"] == "eta0-t2" and report["best_async"] == "eta4-t1"
    assert [r["speedup_vs_best_sync"] for r in rows] == pytest.approx([40 / 60, 1.0, 1.25])
    assert report["overlap_ceiling"] == pytest.approx((0.8 + 1.2) / 1.2)
    # Best sync steps in 2.0 s; the 1-thread learner alone needs 2.0 s per step.
    assert report["learner_bound"] == pytest.approx(2.0 / 2.0)
    rows[0]["publish_s_per_step"] = 0.5  # publishing is learner time too
    assert avs.summarize("math", avs.TASKS["math"], rows, "m")["learner_bound"] == 2.0 / 2.5


def test_throughput_after_the_first_step_weighs_each_step_by_its_samples() -> None:
    memory = MemorySink()
    memory.log_metrics({"eval/accuracy": 0.1}, 0)  # an eval row has neither figure
    for step, (seconds, rate) in enumerate([(10.0, 1.0), (2.0, 4.0), (4.0, 2.0)]):
        memory.log_metrics({"time/step_s": seconds, "throughput/samples_per_s": rate}, step)
    # steps 1 and 2 train 8 samples each in 6 s; the first step's 10 s are left out
    assert avs._after_first_step(memory) == pytest.approx(16 / 6)
    first_only = MemorySink()
    first_only.log_metrics({"time/step_s": 10.0, "throughput/samples_per_s": 1.0}, 0)
    assert avs._after_first_step(first_only) is None


def test_time_to_target_uses_rl_seconds() -> None:
    evals = [
        {"version": 0, "accuracy": 0.3, "rl_s": 7.0},  # before the RL clock: counts as 0
        {"version": 5, "accuracy": 0.4, "rl_s": 10.0},
        {"version": 10, "accuracy": 0.5, "rl_s": 20.0},
    ]
    timed = avs._train_time_evals(evals)
    assert [e["train_s"] for e in timed] == [0.0, 10.0, 20.0]
    assert avs._first_at(timed, 0.45) == 20.0 and avs._first_at(timed, 0.9) is None


def test_arguments_are_checked_before_any_work(capsys) -> None:
    with pytest.raises(SystemExit):
        avs.parse_args(["--tasks", "maths"])
    assert "unknown ['maths']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        avs.parse_args(["--etas", "1,2"])
    assert "must include 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="TASK=DIR"):
        avs.parse_args(["--model", "runs/sft"])


def test_overhead_ratios_use_medians() -> None:
    rows = [
        {"variant": v, "command_s": c, "job_s": j, "fixed_s": c - j, "samples_per_s": 50.0}
        for v, c, j in [
            ("plain", 100, 95),
            ("flow", 110, 96),
            ("flow-server", 103, 96),
            ("plain", 104, 97),
            ("flow", 108, 98),
            ("flow-server", 105, 97),
        ]
    ]
    summary = ovh.summarize(rows)
    assert summary["command_ratio"] == pytest.approx(109 / 102)
    assert summary["job_ratio"] == pytest.approx(97 / 96)
    assert summary["flow"]["fixed_s"] == pytest.approx(12.0)
    assert summary["command_ratio_flow_server"] == pytest.approx(104 / 102)
    # Without the server variant there is no ratio for it.
    assert "command_ratio_flow_server" not in ovh.summarize(
        [r for r in rows if r["variant"] != "flow-server"]
    )


@pytest.mark.e2e
def test_async_vs_sync_runs_end_to_end(tmp_path: Path) -> None:
    """η = 0 and η = 1 on a tiny math run: table, JSON, plots and MLflow runs come out."""
    out = tmp_path / "out"
    avs.main(
        [
            "--tasks",
            "math",
            "--etas",
            "0,1",
            "--sync-threads",
            "1",
            "--fileroot",
            str(tmp_path / "runs"),
            "--out",
            str(out),
            "data.n_train=256",
            "data.n_test=32",
            "eval.n_problems=32",
            "sft.steps=4",
            "learner.total_steps=3",
            "eval.every_n_steps=2",
            "rollout.batch_size=4",
            "algorithm.group_size=4",
        ]
    )
    results = json.loads((out / "results.json").read_text())
    (report,) = results["tasks"]
    assert [r["setting"] for r in report["rows"]] == ["eta0-t1", "eta1-t1"]
    for row in report["rows"]:
        assert row["steps"] == 3 and row["samples_per_s"] > 0 and row["tokens_per_s"] > 0
        assert [e["version"] for e in row["evals"]] == [0, 2, 3]
        # RL seconds exclude the eval at version 2, so they stay below the wall time.
        assert 0 < row["evals"][1]["train_s"] < row["evals"][2]["train_s"] < row["wall_s"]
        assert row["max_staleness"] <= row["eta"]
        assert len(row["step_s_each"]) == 3 and row["after_first_samples_per_s"] > 0
    sync, asynchronous = report["rows"]
    assert sync["mean_staleness"] == 0.0 and sync["speedup_vs_best_sync"] == 1.0
    assert report["overlap_ceiling"] >= 1.0 and report["learner_bound"] > 0
    assert (out / "throughput_vs_eta.png").stat().st_size > 0
    assert (out / "accuracy_vs_time.png").stat().st_size > 0

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    parent = client.get_run(results["mlflow_run_id"])
    assert {"results.json", "throughput_vs_eta.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }
    assert parent.data.metrics["math/speedup_eta1_t1"] == pytest.approx(
        asynchronous["speedup_vs_best_sync"]
    )
    child = client.get_run(asynchronous["mlflow_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    history = client.get_metric_history(child.info.run_id, "staleness/max")
    assert [m.step for m in history] == [0, 1, 2]


def test_soak_memory_summary_counts_from_the_warmup() -> None:
    samples = [(0.0, 100.0), (1.0, 300.0), (2.0, 300.0), (3.0, 301.0), (4.0, 302.0)]
    memory = soak.memory_summary(samples, warmup_s=1.0)
    assert memory["rss_start_mib"] == 300.0 and memory["rss_growth_mib"] == 2.0
    assert memory["rss_peak_mib"] == 302.0
    assert memory["rss_slope_mib_per_min"] == pytest.approx(60 * 0.7)
    with pytest.raises(SystemExit):
        soak.parse_args(["--max-new-tokens", "65"])  # above the default cap of 64


@pytest.mark.integration
def test_server_soak_smoke(tmp_path: Path) -> None:
    """A few seconds of mixed load: every answer as expected, JSON and plot written."""
    result = soak.main(
        ["--seconds", "3", "--valid-clients", "2", "--malformed-clients", "2", "--warmup-s", "0",
         "--max-new-tokens", "4", "--out", str(tmp_path)]
    )  # fmt: skip
    totals = result["summary"]["totals"]
    assert totals["unexpected"] == 0, result["summary"]["rows"]
    assert totals["valid_sent"] > 0 and totals["malformed_sent"] > 0
    assert result["meta"]["server_alive_at_end"] and result["memory"]["rss_peak_mib"] > 0
    saved = json.loads((tmp_path / "server_soak.json").read_text())
    assert saved["summary"]["totals"] == totals
    assert (tmp_path / "server_soak.png").stat().st_size > 0


@pytest.mark.integration
def test_learner_packing_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny run: every layout timed on the same rows; packing into wider rows and sharing the
    prompts of groups compute fewer positions, and the table, JSON and plot are written."""
    from experiments.benchmarks import learner_packing

    monkeypatch.setattr("sys.argv", ["learner_packing", "--presets", "tiny", "--rows", "16",
                                     "--repeats", "1", "--widths", "1,2", "--torch-threads", "1",
                                     "--out", str(tmp_path)])  # fmt: skip
    learner_packing.main()
    rows = json.loads((tmp_path / "learner_packing.json").read_text())["results"]
    by_layout = {r["layout"]: r for r in rows}
    assert set(by_layout) == {"padded", "packed 1x", "packed 2x", "shared prompts"}
    assert by_layout["packed 2x"]["positions"] < by_layout["padded"]["positions"]
    assert by_layout["shared prompts"]["positions"] < 0.8 * by_layout["padded"]["positions"]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert (tmp_path / "learner_packing.png").stat().st_size > 0


@pytest.mark.integration
def test_engine_throughput_conversations_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Multi-turn conversations with and without the prefix cache: with it, most of each later
    call's prompt comes from the cache; without it, none does; the JSON and plot are written."""
    from experiments.benchmarks import engine_throughput

    monkeypatch.setattr("sys.argv", ["engine_throughput", "--turns", "4", "--concurrency", "4",
                                     "--modes", "splice,noprefix", "--duration-s", "1",
                                     "--max-new-tokens", "8", "--no-hf-baseline",
                                     "--out", str(tmp_path)])  # fmt: skip
    engine_throughput.main()
    rows = json.loads((tmp_path / "engine_throughput.json").read_text())["results"]
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["splice"]["prefix_cached_share"] > 0.5
    assert by_mode["noprefix"]["prefix_cached_share"] == 0
    assert all(r["tokens_per_s"] > 0 and r["turns"] == 4 for r in rows)
    assert (tmp_path / "engine_throughput.png").stat().st_size > 0


@pytest.mark.integration
def test_agent_engine_smoke(tmp_path: Path) -> None:
    """Search-agent episodes on the engine with and without the prefix cache: the same seeded
    episodes; only the cached mode takes prompt tokens from the cache; JSON and plot written."""
    from experiments.benchmarks import agent_engine

    agent_engine.main(["--episodes", "6", "--out", str(tmp_path), "data.n_train=8",
                       "data.search_synthetic.corpus_size=40", "agent.max_turns=3",
                       "sampling.max_new_tokens=12"])  # fmt: skip
    rows = {
        r["mode"]: r for r in json.loads((tmp_path / "agent_engine.json").read_text())["results"]
    }
    assert rows["noprefix"]["prefix_cached_tokens"] == 0
    assert all(r["episodes"] == 6 and r["episodes_per_s"] > 0 for r in rows.values())
    assert rows["prefix"]["tokens_generated"] == rows["noprefix"]["tokens_generated"]
    assert (tmp_path / "agent_engine.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        agent_engine.parse_args(["--modes", "prefix,radix"])


def test_weight_sync_arguments_are_checked(capsys) -> None:
    from experiments.benchmarks import weight_sync

    for argv, message in [(["--modes", "disk,nfs"], "unknown ['nfs']"),
                          (["--sizes", "huge"], "unknown ['huge']"),
                          (["--servers", "0"], "--servers"), (["--repeats", "0"], "--repeats")]:  # fmt: skip
        with pytest.raises(SystemExit):
            weight_sync.parse_args(argv)
        assert message in capsys.readouterr().err


@pytest.mark.integration
def test_weight_sync_smoke(tmp_path: Path) -> None:
    """One tiny server, by folder and by broadcast: every row timed, JSON and plot written."""
    from experiments.benchmarks import weight_sync

    result = weight_sync.main(["--sizes", "tiny", "--servers", "1", "--modes", "disk,distributed",
                               "--repeats", "1", "--out", str(tmp_path)])  # fmt: skip
    rows = json.loads((tmp_path / "weight_sync.json").read_text())["results"]
    assert rows == result["results"]
    assert [(r["mode"], r["servers"]) for r in rows] == [("disk", 1), ("distributed", 1)]
    for row in rows:
        assert row["seconds"] > 0 and row["min_s"] > 0 and len(row["times"]) == 1
        assert row["state_bytes"] > 4e6 and row["mb_per_s"] > 0  # ~1 M float32 parameters
    assert 0 < rows[0]["export_s"] < rows[0]["seconds"]
    assert (tmp_path / "weight_sync.png").stat().st_size > 0


def _agent_row(latency: str, eta: int, threads: int, seed: int, samples: float) -> dict:
    return {
        "latency": latency,
        "setting": f"eta{eta}-t{threads}",
        "eta": eta,
        "threads": threads,
        "seed": seed,
        "steps": 3,
        "samples_per_s": samples,
        "accuracy_start": 0.0,
        "accuracy_final": 0.1 * seed,
        "learner_busy_fraction": 0.5,
        "mean_staleness": eta / 2,
        "max_staleness": eta,
        "wall_s": 10.0,
        "time_to_target_s": 5.0 * seed if seed > 1 else None,
    }


def test_agent_latency_settings_and_seed_statistics(capsys, tmp_path: Path) -> None:
    slow = agl.Latency.parse("2/20")
    assert slow.label == "2/20" and slow.overrides() == {
        "tools.latency_s": 2.0,
        "tools.latency_p99_s": 20.0,
        "tools.timeout_s": 20.0,  # cut off at the p99
    }
    assert "tools.timeout_s" not in agl.Latency.parse("none").overrides()
    with pytest.raises(ConfigError, match="tools.timeout_s must be > 0"):
        agl.main(["--latencies", "2/20,none", "--out", str(tmp_path), "tools.timeout_s=0"])
    assert not list(tmp_path.iterdir())  # the bad setting was found before any work
    assert agl.Latency.parse("0.5").label == "0.5"
    with pytest.raises(SystemExit):
        agl.parse_args(["--latencies", "none,5/2"])
    assert "'5/2' needs 0 <= MEDIAN <= P99" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        agl.parse_args(["--latencies", "slow"])
    assert "'slow' is not none" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        agl.parse_args(["--etas", "4"])
    assert "--etas must include 0" in capsys.readouterr().err
    earlier = tmp_path / "earlier.json"
    mine = list(agl.ASYNC_SETTINGS)
    sync, fast = {"setting": "eta0-t2", "eta": 0, "threads": 2}, {"setting": "eta4-t1", "eta": 4}
    runs = [
        {**sync, "latency": "2/20", "seed": 1},
        {**fast, "latency": "2/20", "seed": 1, "async_set": mine[::-1]},  # the same settings
        {**fast, "latency": "2/20", "seed": 2, "async_set": [*mine, "inference.max_batch_rows=1"]},
        {**fast, "latency": "none", "seed": 1, "async_set": mine},  # a latency not asked for
        {**sync, "latency": "2/20", "seed": 1, "threads": 1, "setting": "eta0-t1"},
    ]
    earlier.write_text(
        json.dumps({"config": agl.CONFIG, "model": "m", "overrides": ["a=1"], "runs": runs})
    )
    for argv, message in [
        (["a=2"], "its overrides ['a=1'] are not this run's ['a=2']"),
        (["--model", "other", "a=1"], "its model 'm' is not this run's 'other'"),
        (["--latencies", "2/20,0.5", "a=1"], "--reuse: no η = 0 run at latency 0.5"),
    ]:
        args = agl.parse_args(
            ["--etas", "4", "--latencies", "2/20", "--reuse", str(earlier), *argv]
        )
        with pytest.raises(SystemExit, match=re.escape(message)):
            agl.reused_runs(args.reuse, args)
    args = agl.parse_args(
        ["--etas", "4", "--seeds", "1,2", "--sync-threads", "2", "--latencies", "2/20"]
        + ["--reuse", str(earlier), "--reuse", str(earlier), "a=1"]
    )
    # sync seed 1 (the baseline, though --etas leaves out 0) and η = 4 seed 1, each once; seed 2
    # ran other async settings, so it runs again
    assert agl.reused_runs(args.reuse, args) == ("m", runs[:2])

    rows = [
        _agent_row(lat, eta, threads, seed, samples)
        for lat, eta, threads, samples in [
            ("none", 0, 1, 4.0),
            ("none", 0, 2, 5.0),
            ("none", 4, 1, 6.0),
            ("2/20", 0, 1, 1.0),
            ("2/20", 4, 1, 3.0),
        ]
        for seed in (1, 2, 3)
    ]
    rows[-1]["samples_per_s"] = 4.5  # seeds 1, 2, 3 of 2/20, η = 4: 3, 3, 4.5
    for row in rows:  # after the first step: 2/20's runs only, and seed 1 of its sync lacks it
        if row["latency"] == "2/20" and (row["eta"], row["seed"]) != (0, 1):
            row["after_first_samples_per_s"] = row["samples_per_s"] + row["seed"]
    entries = {(e["latency"], e["setting"]): e for e in agl.aggregate(rows)}
    fast_sync, slow_async = entries["none", "eta0-t2"], entries["2/20", "eta4-t1"]
    assert fast_sync["best_sync"] == "eta0-t2" and entries["none", "eta4-t1"][
        "speedup_vs_best_sync"
    ] == pytest.approx(6 / 5)
    assert slow_async["samples_per_s"] == pytest.approx(3.5)
    assert slow_async["samples_per_s_se"] == pytest.approx(0.8660254 / 3**0.5)
    assert slow_async["speedup_vs_best_sync"] == pytest.approx(3.5)  # against 2/20's own sync
    assert slow_async["accuracy_final"] == pytest.approx(0.2)
    assert slow_async["target_hits"] == 2 and slow_async["time_to_target_s"] == pytest.approx(12.5)
    # η = 4: 3+1, 3+2, 4.5+3 → 5.5 over 3 seeds; sync: 1+2, 1+3 → 3.5 over the 2 seeds having it
    assert slow_async["after_first_samples_per_s"] == pytest.approx(5.5)
    assert entries["2/20", "eta0-t1"]["after_first_samples_per_s_se"] == pytest.approx(0.5)
    assert slow_async["after_first_speedup_vs_best_sync"] == pytest.approx(5.5 / 3.5)
    assert math.isnan(fast_sync["after_first_samples_per_s"])  # no run of it has the figure
    assert agl._after_first(fast_sync) == "—"
    assert agl._after_first(slow_async) == "5.50 ± 1.04 (1.57)"
    assert mean_se([2.0]) == (2.0, None)
    assert slow_async["ttt_speedup_vs_sync"] is None  # sync missed the target in seed 1

    # time to target and the accuracy-against-time curve, where every seed reached it
    timed = []
    for bound, per_eval_s in ((0, 30.0), (4, 10.0)):
        for seed in (1, 2):
            row = _agent_row("2/20", bound, 1, seed, 1.0)
            row["evals"] = [
                {"version": 5 * k, "accuracy": 0.1 * k + 0.01 * seed, "train_s": per_eval_s * k}
                for k in range(4)
            ]
            row["time_to_target_s"] = per_eval_s * 2  # 0.2 reached at the second eval
            timed.append(row)
    sync_entry, async_entry = agl.aggregate(timed)
    assert async_entry["ttt_speedup_vs_sync"] == pytest.approx(3.0)
    assert sync_entry["ttt_speedup_vs_sync"] == pytest.approx(1.0)
    assert async_entry["curve"][2] == pytest.approx({"train_s": 20.0, "accuracy": 0.215})
    assert len(async_entry["curve"]) == 4
    assert agl.parse_args(["--config", "experiments/agent_openai.yaml"]).config == (
        "experiments/agent_openai.yaml"
    )


def test_agent_latency_runs_end_to_end(tmp_path: Path) -> None:
    """Sync and η = 1 on the search agent at one long-tailed latency, one RL step each, from an
    untrained chat model: the summary, JSON, plot and MLflow runs come out."""
    corpus = [f"search open Answer: {w}" for w in ("Kasen", "Mira", "1942", "founder")]
    model = create_pretrained("tiny", corpus, tmp_path / "model", vocab_size=300, seed=1, chat=True)
    out = tmp_path / "out"
    overrides = [
        "data.n_train=16", "data.n_test=4", "eval.n_problems=4", "eval.max_new_tokens=8",
        "data.search_synthetic.corpus_size=40", "learner.total_steps=1", "eval.every_n_steps=0",
        "rollout.batch_size=2", "algorithm.group_size=2", "sampling.max_new_tokens=8",
        "agent.max_turns=2",
    ]  # fmt: skip
    agl.main(
        [
            "--etas", "0,1", "--sync-threads", "1", "--seeds", "2", "--latencies", "0.05/0.2",
            "--model", str(model), "--fileroot", str(tmp_path / "runs"), "--out", str(out),
            *overrides,
        ]
    )  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert [(r["trial"], r["seed"], r["latency"]) for r in results["runs"]] == [
        ("eta0-t1-lat0.05-0.2-seed2", 2, "0.05/0.2"),
        ("eta1-t1-lat0.05-0.2-seed2", 2, "0.05/0.2"),
    ]
    assert all(r["steps"] == 1 and r["samples_per_s"] > 0 for r in results["runs"])
    assert all(r["after_first_samples_per_s"] is None for r in results["runs"])  # one step
    assert results["complete"] and results["reused"] == []
    sync, asynchronous = results["summary"]
    assert sync["seeds"] == [2] and sync["speedup_vs_best_sync"] == 1.0
    assert sync["samples_per_s_se"] is None and asynchronous["max_staleness"] <= 1
    assert (out / "agent_latency.png").stat().st_size > 0
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    children = client.search_runs(
        [client.get_experiment_by_name("benchmarks").experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{results['mlflow_run_id']}'",
    )
    assert len(children) == 2

    # η = 1 again with an async-only setting, on the first invocation's sync run
    again = tmp_path / "again"
    agl.main(
        [
            "--etas", "1", "--seeds", "2", "--latencies", "0.05/0.2",
            "--reuse", str(out / "results.json"), "--async-set", "inference.max_batch_rows=1",
            "--fileroot", str(tmp_path / "runs2"), "--out", str(again), *overrides,
        ]
    )  # fmt: skip
    second = json.loads((again / "results.json").read_text())
    assert results["async_set"] == list(agl.ASYNC_SETTINGS)
    assert second["model"] == str(model) and second["reused"] == [str(out / "results.json")]
    assert second["async_set"] == [*agl.ASYNC_SETTINGS, "inference.max_batch_rows=1"]
    reused, rerun = second["runs"]
    assert reused == results["runs"][0]  # the sync run, not run again
    assert rerun["trial"] == "eta1-t1-lat0.05-0.2-seed2" and rerun["steps"] == 1
    saved = (tmp_path / "runs2").rglob(f"{rerun['trial']}/config.yaml")
    assert (
        "max_batch_rows: 1" in (text := next(saved).read_text()) and "kv_after_update: keep" in text
    )
    sync_cfg = next((tmp_path / "runs").rglob(f"{reused['trial']}/config.yaml")).read_text()
    assert "kv_after_update: recompute" in sync_cfg and "max_batch_rows: 0" in sync_cfg
    assert second["summary"][1]["speedup_vs_best_sync"] == pytest.approx(
        rerun["samples_per_s"] / reused["samples_per_s"]
    )


def test_eta_accuracy_variants_are_typed_and_checked(capsys) -> None:
    nocap = eta.Variant.parse("nocap:algorithm.behaviour_cap=null,algorithm.lr=1e-4")
    assert nocap.overrides == {"algorithm": {"behaviour_cap": None, "lr": 1e-4}}
    assert eta.Variant.parse("dapo:algorithm=dapo").overrides == {"algorithm": {"name": "dapo"}}
    for bad, message in [
        ("nocap", "is not NAME:KEY=VALUE"),
        ("nocap:", "is not NAME:KEY=VALUE"),
        ("base:algorithm.lr=1", "'base' is the config as given"),
        ("x:algorithm.lr", "must look like key=value"),
    ]:
        with pytest.raises(SystemExit):
            eta.parse_args(["--variant", bad])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eta.parse_args(["--variant", "a:algorithm.lr=1", "--variant", "a:algorithm.lr=2"])
    assert "distinct" in capsys.readouterr().err
    assert [v.name for v in eta.parse_args(["--no-base", "--variant", "a:x.y=1"]).variants] == ["a"]
    # an unknown key is found before any work (the variant's layer is checked on resolve)
    with pytest.raises(ConfigError, match="algorithm.behavior_cap"):
        eta.main(["--variant", "typo:algorithm.behavior_cap=2", "--out", "/nonexistent/x"])


def test_seed_statistics_compare_accuracy_with_sync_of_the_same_variant() -> None:
    rows = [
        _agent_row("base", e, 1, seed, 10.0) | {"variant": "base"}
        for e in (0, 4)
        for seed in (1, 2, 3)
    ]
    for row in rows:
        row["accuracy_final"] = 0.5 + 0.01 * row["seed"] - (0.03 if row["eta"] else 0.0)
        row["diagnostics"] = {"actor/behav_masked_frac": 0.001 * row["eta"] * row["seed"]}
    del rows[-1]["diagnostics"]["actor/behav_masked_frac"]  # a run without the figure
    sync, stale = aggregate_seeds(rows, by="variant")
    assert sync["variant"] == "base" and sync["accuracy_gap_se"] is None
    se = 0.01 / 3**0.5  # seeds 1, 2, 3 → +0.01, +0.02, +0.03: stdev 0.01
    assert stale["accuracy_gap_vs_sync"] == pytest.approx(-0.03)
    assert stale["accuracy_gap_se"] == pytest.approx((2 * se**2) ** 0.5)
    assert stale["diagnostics"]["actor/behav_masked_frac"][0] == pytest.approx(0.006)  # 2 runs


def test_eta_accuracy_shared_sync_compares_every_variant_with_base() -> None:
    args = eta.parse_args(["--etas", "0,4", "--seeds", "1,2", "--shared-sync", "--variant",
                           "tis:algorithm.behaviour_mask_mode=cap"])  # fmt: skip
    rows = [
        _agent_row(v, e, 1, seed, 10.0) | {"variant": v, "accuracy_final": 0.5 + 0.1 * e}
        for v, e in (("base", 0), ("base", 4), ("tis", 4))
        for seed in (1, 2)
    ]
    rows = eta.share_sync(rows, args.variants)
    shared = [r for r in rows if r.get("shared_from")]
    assert [(r["variant"], r["eta"], r["seed"]) for r in shared] == [("tis", 0, 1), ("tis", 0, 2)]
    entries = {(e["variant"], e["eta"]): e for e in aggregate_seeds(rows, by="variant")}
    assert entries[("tis", 4)]["accuracy_gap_vs_sync"] == pytest.approx(0.4)
    for bad in (
        ["--shared-sync", "--etas", "4"],
        ["--shared-sync", "--no-base", "--variant", "a:x.y=1"],
    ):
        with pytest.raises(SystemExit):
            eta.parse_args(bad)


@pytest.mark.e2e
def test_eta_accuracy_runs_end_to_end(tmp_path: Path) -> None:
    """One variant at η = 0 and 1 over two RL seeds from one tiny warm start: the seeds share
    the problems (the same start accuracy), the variant reaches the config, the objective's
    statistics come out."""
    out = tmp_path / "out"
    eta.main(
        [
            "--etas", "0,1", "--seeds", "2,3", "--sync-threads", "1", "--steps", "2",
            "--eval-every", "0", "--no-base", "--variant", "cap2:algorithm.behaviour_cap=2",
            "--fileroot", str(tmp_path / "runs"), "--out", str(out),
            "data.n_train=256", "data.n_test=32", "eval.n_problems=32", "sft.steps=4",
            "rollout.batch_size=4", "algorithm.group_size=4",
        ]
    )  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert [(r["variant"], r["trial"]) for r in runs] == [
        ("cap2", "eta0-t1-cap2-seed2"),
        ("cap2", "eta0-t1-cap2-seed3"),
        ("cap2", "eta1-t1-cap2-seed2"),
        ("cap2", "eta1-t1-cap2-seed3"),
    ]
    assert len({r["accuracy_start"] for r in runs}) == 1  # same model, same problems, greedy
    for run in runs:
        diagnostics = run["diagnostics"]
        assert {"actor/behav_weight_max", "actor/clip_frac", "staleness/token_mean"} <= set(
            diagnostics
        )
        assert 0 <= diagnostics["staleness/token_mean"] <= run["eta"]
    sync, stale = results["summary"]
    assert sync["seeds"] == [2, 3] and stale["accuracy_gap_vs_sync"] == pytest.approx(
        stale["accuracy_final"] - sync["accuracy_final"]
    )
    assert (out / "eta_accuracy.png").stat().st_size > 0
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    child = client.get_run(runs[2]["mlflow_run_id"])
    assert child.data.params["algorithm.behaviour_cap"] == "2.0"
    assert child.data.params["experiment.seed"] == "2" and child.data.params["data.seed"] == "1"


def test_vs_trl_refuses_what_trl_would_run_differently(tmp_path: Path) -> None:
    for override, field_name in [
        ("algorithm.kl_coef=0.01", "algorithm.kl_coef"),
        ("algorithm.ppo_n_minibatches=2", "algorithm.ppo_n_minibatches"),
        ("algorithm=dr_grpo", "algorithm.normalize_std"),
    ]:
        with pytest.raises(ConfigError, match=field_name):
            vs_trl.main(["--out", str(tmp_path / "out"), "--fileroot", str(tmp_path), override])
    assert not (tmp_path / "out").exists()  # refused before any work
    with pytest.raises(SystemExit):
        vs_trl.parse_args(["--systems", "trl,verl"])


@pytest.mark.e2e
def test_vs_trl_runs_trl_and_asyncrl_on_the_same_work(tmp_path: Path) -> None:
    """One repeat of TRL's GRPOTrainer (a real run, its own process), asyncrl sync and asyncrl
    under the adaptive window from one tiny warm start; every final model is scored by the same
    evaluation."""
    out = tmp_path / "out"
    vs_trl.main(
        [
            "--repeats", "1", "--steps", "2", "--systems", "trl,asyncrl-sync,asyncrl-adaptive",
            "--fileroot", str(tmp_path / "runs"),
            "--out", str(out), "data.n_train=128", "data.n_test=16", "eval.n_problems=16",
            "sft.steps=4", "rollout.batch_size=2", "algorithm.group_size=4",
            "sampling.max_new_tokens=8", "eval.max_new_tokens=8",
        ]
    )  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    runs = {r["system"]: r for r in results["runs"]}
    assert list(runs) == ["trl", "asyncrl-sync", "asyncrl-adaptive"]
    # the window starts at 1 and moves at most once in 2 steps (a fixed η=4 run ends at 4)
    assert runs["asyncrl-sync"]["final_window"] == 0
    assert 1 <= runs["asyncrl-adaptive"]["final_window"] <= 2
    trl = json.loads((out / "trl-r1" / "result.json").read_text())
    assert trl["steps"] == 2 and trl["samples"] == 2 * 2 * 4 and len(trl["reward_mean"]) == 2
    spec = json.loads((out / "trl-r1" / "spec.json").read_text())
    assert spec["weight_decay"] == 0.0 and spec["group_size"] == 4 and spec["max_new_tokens"] == 8
    for run in runs.values():
        assert run["samples_per_s"] > 0 and 0 <= run["accuracy"] <= 1
        assert Path(run["final_model_dir"], "model.safetensors").is_file()
    # the shared evaluation of asyncrl's final model agrees with the run's own final eval
    assert runs["asyncrl-sync"]["accuracy"] == pytest.approx(
        runs["asyncrl-sync"]["in_run_accuracy"]
    )
    summary = {e["system"]: e for e in results["summary"]}
    assert summary["trl"]["speedup_vs_trl"] == 1.0
    assert results["matched"]["kl"].startswith("β = 0")
    assert (out / "vs_trl.png").stat().st_size > 0
