"""The reference loop (experiments/reference_grpo.py) against the platform at η = 0.

Same config, seed and starting model: the Trainer (rollout worker in its own process, batched
engine, learner with micro-batches) and the single-process reference draw the same prompts,
sample the same tokens (per-request seeds keyed on the draw) and so log the same rewards and
losses, step after step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config import load_config
from core.models import load_model
from core.runtime.job import run_experiment
from core.runtime.stages import prepare_data
from experiments.reference_grpo import train

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
STEPS = 3


@pytest.mark.e2e
def test_reference_loop_matches_the_trainer_at_eta_0(tmp_path: Path) -> None:
    cfg = load_config(
        QUICKSTART,
        [
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=ref",
            "data.n_train=64",
            "data.n_test=8",
            "eval.n_problems=8",
            "eval.max_new_tokens=4",
            "eval.every_n_steps=0",
            "checkpoint.every_n_steps=0",
            "sft.enabled=false",
            f"learner.total_steps={STEPS}",
            "rollout.max_staleness=0",
            "rollout.batch_size=4",
            "algorithm.group_size=4",
            "sampling.max_new_tokens=12",
            "rollout.reward_fn=tests.experiments.rewards:digit_share",
        ],
    )
    run_experiment(cfg)
    run_dir = tmp_path / "quickstart" / "ref"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trainer = [row for row in rows if "actor/loss" in row]
    assert [row["step"] for row in trainer] == list(range(STEPS))

    reference, policy = train(cfg, str(run_dir / "model_init"), prepare_data(cfg).train, STEPS)

    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [sorted(b["sample_ids"]) for b in batches] == [
        sorted(s["sample_ids"]) for s in reference
    ]
    for ours, theirs in zip(reference, trainer, strict=True):
        assert ours["reward"] == pytest.approx(theirs["reward/mean"], abs=1e-7)  # same samples
        assert ours["loss"] == pytest.approx(theirs["actor/loss"], rel=1e-4, abs=1e-7)
        assert ours["grad_norm"] == pytest.approx(theirs["actor/grad_norm"], rel=1e-4)
    # ... so the same weights, up to float rounding (which Adam's normalised step can amplify
    # on parameters whose gradient is ~0): the Trainer's final export against the reference's.
    start = load_model(run_dir / "model_init").state_dict()
    final = load_model(run_dir / "final").state_dict()
    ours = policy.state_dict()
    apart = sum(float((ours[n] - final[n]).pow(2).sum()) for n in final) ** 0.5
    moved = sum(float((final[n] - start[n]).pow(2).sum()) for n in final) ** 0.5
    assert moved > 1e-3 and apart < 1e-3 * moved, (apart, moved)


@pytest.mark.e2e
def test_the_reference_starts_from_nothing(tmp_path: Path) -> None:
    """Without --model the script builds the tiny model and its SFT warm start itself."""
    import subprocess
    import sys

    overrides = [f"cluster.fileroot={tmp_path}", "experiment.trial=scratch", "data.n_train=32",
                 "data.n_test=8", "sft.steps=4", "sft.batch_size=8", "rollout.batch_size=2",
                 "algorithm.group_size=2", "sampling.max_new_tokens=6"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "experiments/reference_grpo.py", "--steps", "2", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert [
        line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("step ")
    ] == [
        "step 0",
        "step 1",
    ]
    run_dir = tmp_path / "quickstart" / "scratch"
    assert (run_dir / "model_init" / "config.json").is_file()  # built here
    assert (run_dir / "sft" / "config.json").is_file()  # and warm-started here
