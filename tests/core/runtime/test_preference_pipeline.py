"""The preference stages end to end: data → pairs → model → SFT → reward model → eval → DPO →
eval, on two FSDP2 ranks over gloo; the held-out preference accuracy of the policy and the
pairwise accuracy of the reward model raised, their numbers in the summary and metrics."""

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
    "sft.steps=60",
    "sft.batch_size=16",
    "preference.hard_fraction=0",  # direct wrong answers: a preference 30 steps can learn
    "dpo.steps=30",
    "dpo.batch_size=8",
    "dpo.lr=4e-3",
    "dpo.warmup_steps=2",
    "reward_model.enabled=true",
    "reward_model.steps=30",
    "reward_model.batch_size=8",
    "reward_model.lr=2e-3",
    "reward_model.warmup_steps=2",
    "preference.n_test=40",
    "eval.n_problems=60",
    "tracking.tensorboard=false",
]


@pytest.mark.e2e
def test_dpo_and_reward_model_learn_the_held_out_preferences(tmp_path: Path) -> None:
    cfg = load_config(
        RECIPE, [f"cluster.fileroot={tmp_path}", "experiment.trial=a", "learner.n_ranks=2", *SMALL]
    )
    ran: list[str] = []

    def runner(name: str, fn, /, *args):
        ran.append(name)
        return fn(*args)

    summary = run_experiment(cfg, run_stage=runner)
    assert ran == ["prepare_data", "prepare_pairs", "build_model", "sft_warm_start",
                   "reward_model", "evaluate_start", "dpo", "evaluate", "report"]  # fmt: skip
    assert summary["algorithm"] == "dpo"
    before, after = summary["preference_accuracy_before"], summary["preference_accuracy_after"]
    assert after >= before + 0.15, (before, after)
    dpo = summary["dpo"]
    assert dpo["before"]["reward_margin"] == 0.0 and dpo["after"]["reward_margin"] > 0
    assert dpo["after"]["reward_accuracy"] > 0.8 and dpo["n_test_pairs"] == 40
    assert summary["eval_start"]["n"] == 60 and summary["eval_before"]["n"] == 60
    assert summary["accuracy_before"] == summary["eval_start"]["accuracy"]
    assert summary["accuracy_after"] == summary["eval_before"]["accuracy"]  # the final eval
    rm_before, rm_after = (summary[f"reward_model_accuracy_{w}"] for w in ("before", "after"))
    assert rm_after >= rm_before + 0.15 and rm_after > 0.8, (rm_before, rm_after)
    assert summary["reward_model"]["after"]["margin"] > summary["reward_model"]["before"]["margin"]
    run = tmp_path / "dpo_quickstart" / "a"
    assert (run / "reward_model" / "value_head.safetensors").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in rows if "dpo/loss" in r]
    assert [r["step"] for r in losses] == list(range(1, 31))
    assert len([r for r in rows if "reward_model/loss" in r]) == 30
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
                               f"preference.pairs={pairs}", *SMALL])  # fmt: skip
    ran: list[str] = []

    def runner(name: str, fn, /, *args):
        ran.append(name)
        return fn(*args)

    with pytest.raises(
        ConfigError, match=r"preference.chosen_key='chosen'.*\['better', 'prompt', 'rejected'\]"
    ):
        run_experiment(cfg, run_stage=runner)
    assert ran == ["prepare_data", "prepare_pairs"]
    assert not (tmp_path / "dpo_quickstart" / "b" / "model_init").exists()


@pytest.mark.e2e
def test_a_learned_reward_model_scores_async_rl(tmp_path: Path) -> None:
    """data → pairs → model → SFT → reward model → RL rewarded by it alone; evaluation still
    reports the task's own accuracy."""
    cfg = load_config(
        ROOT / "experiments" / "reward_model_quickstart.yaml",
        [f"cluster.fileroot={tmp_path}", "experiment.trial=c", *SMALL, "dpo.enabled=false",
         "sft.steps=40", "reward_model.steps=10", "learner.total_steps=2", "rollout.batch_size=4",
         "algorithm.group_size=4", "eval.every_n_steps=2", "checkpoint.every_n_steps=0"],
    )  # fmt: skip
    summary = run_experiment(cfg)
    assert summary["algorithm"] == "grpo" and summary["steps"] == 2
    assert "reward_model_accuracy_after" in summary and "preference_accuracy_after" not in summary
    run = tmp_path / "reward_model_quickstart" / "c"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2
    for row in steps:  # the RL reward is the reward model's score alone (reward_model.task_coef=0)
        assert row["reward/mean"] == pytest.approx(row["agent/reward_model"], abs=1e-5)
        assert 0.0 <= row["agent/task_reward"] <= 1.0
    for evaluation in summary["evals"]:  # accuracy is the task's: its checker, not the model
        assert evaluation["accuracy"] == pytest.approx(evaluation["metrics"]["task_reward"])
        assert "reward_model" in evaluation["metrics"]
