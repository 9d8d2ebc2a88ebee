"""The DPO pipeline end to end: data → pairs → model → SFT → eval → DPO (two FSDP2 ranks over
gloo) → eval, the held-out preference accuracy raised, its numbers in the summary and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.runtime.job import run_experiment

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "dpo_quickstart.yaml"
SMALL = [
    "data.n_train=600",
    "data.n_test=60",
    "sft.steps=150",
    "sft.batch_size=16",
    "dpo.steps=30",
    "dpo.batch_size=8",
    "dpo.lr=2e-3",
    "dpo.warmup_steps=2",
    "dpo.n_test=40",
    "eval.n_problems=60",
    "tracking.tensorboard=false",
]


@pytest.mark.e2e
def test_dpo_raises_held_out_preference_accuracy(tmp_path: Path) -> None:
    cfg = load_config(
        RECIPE, [f"cluster.fileroot={tmp_path}", "experiment.trial=a", "learner.n_ranks=2", *SMALL]
    )
    ran: list[str] = []

    def runner(name: str, fn, /, *args):
        ran.append(name)
        return fn(*args)

    summary = run_experiment(cfg, run_stage=runner)
    assert ran == ["prepare_data", "prepare_pairs", "build_model", "sft_warm_start",
                   "evaluate_start", "dpo", "evaluate", "report"]  # fmt: skip
    assert summary["algorithm"] == "dpo"
    before, after = summary["preference_accuracy_before"], summary["preference_accuracy_after"]
    assert after >= before + 0.15, (before, after)
    dpo = summary["dpo"]
    assert dpo["before"]["reward_margin"] == 0.0 and dpo["after"]["reward_margin"] > 0
    assert dpo["after"]["reward_accuracy"] > 0.8 and dpo["n_test_pairs"] == 40
    assert summary["eval_start"]["n"] == 60 and summary["eval_before"]["n"] == 60
    assert summary["accuracy_before"] == summary["eval_start"]["accuracy"]
    assert summary["accuracy_after"] == summary["eval_before"]["accuracy"]  # the final eval
    run = tmp_path / "dpo_quickstart" / "a"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "dpo/loss" in r]
    assert [r["step"] for r in losses] == list(range(1, 31))
    evals = [r for r in rows if "dpo_eval/preference_accuracy" in r]
    assert [(r["step"], r["dpo_eval/preference_accuracy"]) for r in evals] == [
        (0, before),
        (30, after),
    ]
    pairs = (run / "preference" / "test.jsonl").read_text().splitlines()
    assert json.loads(pairs[0])["rejected"].startswith("#### ")
    assert (run / "dpo" / "config.json").exists()


@pytest.mark.unit
def test_a_bad_pairs_file_fails_before_any_model_is_built(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "p", "better": "a", "rejected": "b"}) + "\n")
    cfg = load_config(RECIPE, [f"cluster.fileroot={tmp_path}", "experiment.trial=b",
                               f"dpo.pairs={pairs}", *SMALL])  # fmt: skip
    ran: list[str] = []

    def runner(name: str, fn, /, *args):
        ran.append(name)
        return fn(*args)

    with pytest.raises(
        ConfigError, match=r"dpo.chosen_key='chosen'.*\['better', 'prompt', 'rejected'\]"
    ):
        run_experiment(cfg, run_stage=runner)
    assert ran == ["prepare_data", "prepare_pairs"]
    assert not (tmp_path / "dpo_quickstart" / "b" / "model_init").exists()
