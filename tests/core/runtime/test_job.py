"""The main job's stages as plain functions, on synthetic data, bundled GSM8K and an s3:// fileroot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

from core.config import load_config
from core.runtime.job import run_experiment
from core.runtime.stages import build_or_load_model, evaluate_model, prepare_data

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
# data → model → eval only (SFT and RL have their own tests in test_trainer.py)
SMALL = [
    "data.n_train=200",
    "data.n_test=30",
    "eval.n_problems=30",
    "eval.max_new_tokens=8",
    "eval.max_concurrent=16",
    "sft.enabled=false",
    "learner.total_steps=0",
]


@pytest.mark.e2e
def test_job_on_synthetic_data(tmp_path: Path) -> None:
    cfg = load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}", "experiment.trial=a", *SMALL])
    seen: list[tuple[str, int | None]] = []
    ran: list[str] = []

    def progress(name: str, total: int | None):
        seen.append((name, total))
        return lambda n: None

    def runner(name: str, fn, /, *args):  # a stage runner sees every stage, in order
        ran.append(name)
        return fn(*args)

    summary = run_experiment(cfg, run_stage=runner, progress=progress)
    assert ran == ["prepare_data", "build_model", "evaluate", "report"]
    assert seen == [("prepare_data", None), ("build_model", None), ("evaluate", 30)]
    assert summary["eval_before"]["n"] == 30
    assert set(summary["eval_before"]["metrics"]) == {"direct_share"}  # GSM8K's own metric
    assert set(summary["timings"]) == {f"{name}_s" for name in ran[:-1]}
    on_disk = json.loads((tmp_path / "quickstart" / "a" / "summary.json").read_text())
    assert on_disk["accuracy_before"] == summary["accuracy_before"]
    assert on_disk["config_hash"] == summary["config_hash"]


@pytest.mark.unit
def test_data_preparation_is_cached_by_the_data_config(tmp_path: Path) -> None:
    cfg = load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}", *SMALL])
    first, second = prepare_data(cfg), prepare_data(cfg)
    assert not first.cached and second.cached and first.train_url == second.train_url
    assert second.train == first.train and second.test == first.test
    other = prepare_data(
        load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}", *SMALL, "data.n_train=60"])
    )
    assert not other.cached and other.train_url != first.train_url and len(other.train) == 60
    reseeded = prepare_data(
        load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}", *SMALL, "experiment.seed=2"])
    )
    assert not reseeded.cached and reseeded.train != first.train
    # data.seed pins the problems while the experiment seed changes
    pinned = prepare_data(
        load_config(
            QUICKSTART,
            [f"cluster.fileroot={tmp_path}", *SMALL, "experiment.seed=2", "data.seed=1"],
        )
    )
    assert pinned.test == first.test and pinned.train == first.train


@pytest.mark.e2e
def test_stages_on_bundled_gsm8k(tmp_path: Path) -> None:
    cfg = load_config(
        QUICKSTART,
        [
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=g",
            "data.source=gsm8k",
            "data.gsm8k_path=bundled",
            "data.n_train=100",
            "data.n_test=8",
            "eval.n_problems=8",
            "eval.max_new_tokens=4",
            "sft.enabled=false",
            "learner.total_steps=0",
        ],
    )
    data = prepare_data(cfg)
    assert len(data.train) == 100 and len(data.test) == 8
    assert data.test[0]["question"].startswith("Janet")  # the first GSM8K test problem
    model_dir = build_or_load_model(cfg, data)
    result = evaluate_model(cfg, model_dir, data.test)
    assert result.n == 8 and result.accuracy == 0.0  # an untrained model
    assert 0 < result.mean_new_tokens <= 4
    assert len(result.examples) == 3 and result.examples[0]["question"].startswith("Janet")


@pytest.mark.integration
def test_job_with_s3_fileroot(
    tmp_path: Path,
    s3_bucket: str,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    s3_storage_options: dict[str, Any],
) -> None:
    # s3fs and boto3 honour these, as they would on a real deployment
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_storage_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_storage_options["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fsspec.filesystem("s3").clear_instance_cache()
    cfg = load_config(
        QUICKSTART, [f"cluster.fileroot=s3://{s3_bucket}/runs", "experiment.trial=s3", *SMALL]
    )
    summary = run_experiment(cfg)
    fs = fsspec.filesystem("s3", **s3_storage_options)
    base = f"{s3_bucket}/runs/quickstart/s3"
    assert json.loads(fs.cat(f"{base}/summary.json"))["eval_before"]["n"] == 30
    assert fs.exists(f"{base}/config.yaml")
    assert summary["data"]["train_url"].startswith(f"s3://{s3_bucket}/runs/_cache/data/")
    assert len(fs.cat(summary["data"]["train_url"]).splitlines()) == 200
    assert Path(summary["model_dir"]).is_dir()  # staged locally for from_pretrained ...
    assert fs.exists(f"{base}/model_init/model.safetensors")  # ... and uploaded beside the run
