"""The stages before RL resume under ``checkpoint.recover=auto``: a run stopped during DPO goes
on from its newest DPO checkpoint to the same weights as a run never stopped, reusing the SFT
and reward-model stages it had finished; a changed setting trains a stage again."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from core.config import load_config
from core.runtime.checkpointing import MARKER
from core.runtime.job import run_experiment
from core.runtime.stage_resume import finished_stage

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "dpo_quickstart.yaml"
SMALL = [
    "data.n_train=64",
    "data.n_test=16",
    "sft.steps=4",
    "sft.batch_size=8",
    "reward_model.enabled=true",
    "reward_model.steps=3",
    "reward_model.batch_size=4",
    "dpo.steps=6",
    "dpo.batch_size=4",
    "dpo.lr=1e-3",
    "dpo.eval_start=false",
    "preference.n_test=8",
    "eval.n_problems=8",
    "checkpoint.every_n_steps=2",
    "tracking.tensorboard=false",
]


class Stop(Exception):
    """The interruption: raised from DPO's progress tick after ``at`` steps."""


def _stop_dpo_after(at: int):
    def progress(name: str, total: int | None):
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            if name == "dpo" and done[0] == at:
                raise Stop(f"stopped after DPO step {at}")

        return tick

    return progress


def _weights(run: Path, stage: str) -> dict[str, torch.Tensor]:
    return load_file(run / stage / "model.safetensors")


@pytest.mark.e2e
def test_a_run_stopped_during_dpo_resumes_to_the_straight_runs_weights(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def config(trial: str, *extra: str):
        return load_config(RECIPE, [f"cluster.fileroot={tmp_path}", f"experiment.trial={trial}",
                                    *SMALL, *extra])  # fmt: skip

    straight = run_experiment(config("straight"))
    run = tmp_path / "dpo_quickstart" / "stopped"
    with pytest.raises(Stop):
        run_experiment(config("stopped"), progress=_stop_dpo_after(5))
    dpo_ckpts = run / "checkpoints" / "dpo"
    assert sorted(p.name for p in dpo_ckpts.iterdir()) == ["step-000002", "step-000004"]
    assert (dpo_ckpts / "step-000004" / MARKER).exists()
    assert (run / "sft" / "stage.json").exists() and (run / "reward_model" / "stage.json").exists()
    assert not (run / "dpo" / "stage.json").exists()
    sft_mtime = (run / "sft" / "model.safetensors").stat().st_mtime_ns

    ran: list[str] = []

    def runner(name: str, fn, /, *args):
        ran.append(name)
        return fn(*args)

    caplog.set_level(logging.INFO, logger="core.runtime.stage_resume")
    resumed = run_experiment(config("stopped", "checkpoint.recover=auto"), run_stage=runner)
    log = caplog.text
    assert "sft already finished in this run" in log
    assert "reward_model already finished in this run" in log
    assert f"resuming dpo from {dpo_ckpts / 'step-000004'}" in log
    assert ran == ["prepare_data", "prepare_pairs", "build_model", "sft_warm_start",
                   "reward_model", "dpo", "evaluate", "report"]  # fmt: skip
    # SFT was not trained again; DPO trained steps 5 and 6 only, to the straight run's weights.
    assert (run / "sft" / "model.safetensors").stat().st_mtime_ns == sft_mtime
    assert resumed["dpo"]["resumed_from"] == 4 and "resumed_from" not in straight["dpo"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    dpo_steps = [r["step"] for r in rows if "dpo/loss" in r]
    assert dpo_steps == [1, 2, 3, 4, 5, 5, 6]  # the first attempt's five, then the resumed two
    got, want = _weights(run, "dpo"), _weights(tmp_path / "dpo_quickstart" / "straight", "dpo")
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    for key in ("preference_accuracy_before", "preference_accuracy_after",
                "reward_model_accuracy_after", "sft_final_loss", "accuracy_after"):  # fmt: skip
        assert resumed[key] == straight[key], key
    assert not dpo_ckpts.exists()  # removed once the stage finished

    # A stage whose settings changed trains again (and says which); the others are reused.
    caplog.clear()
    changed = config("stopped", "checkpoint.recover=auto", "dpo.beta=0.2")
    assert finished_stage(changed, "dpo") is None
    assert "training dpo again: its settings changed: dpo.beta: 0.1 -> 0.2" in caplog.text
    assert finished_stage(changed, "reward_model") is not None
    assert finished_stage(config("stopped"), "sft") is None  # recover=off: every stage runs
