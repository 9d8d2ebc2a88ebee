"""A short RL run with LoRA (``model.lora_rank``) end to end on the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from core.config import load_config
from core.models import load_model
from core.runtime.checkpointing import CheckpointManager
from core.runtime.job import run_experiment
from tests.core.runtime.test_trainer import QUICKSTART, TINY, read_jsonl


@pytest.mark.e2e
def test_rl_with_lora_publishes_merged_weights_and_keeps_the_adapter(tmp_path: Path) -> None:
    cfg = load_config(
        QUICKSTART,
        [
            *TINY,
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=lora",
            "learner.total_steps=2",
            "model.lora_rank=4",
            "algorithm.kl_coef=0.01",  # the reference pass: the same model, adapters off
            "algorithm.entropy_coef=0.01",  # a gradient even when every reward in a group ties
        ],
    )
    summary = run_experiment(cfg)
    run_dir = tmp_path / "quickstart" / "lora"
    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "actor/loss" in m]
    assert len(steps) == 2 and all(math.isfinite(m["actor/loss"]) for m in steps)
    assert all(m["actor/grad_norm"] > 0 for m in steps)
    assert summary["rollout"]["version"] == summary["version"] == 2

    final = Path(summary["final_model_dir"])
    adapter = final / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    checkpoint = Path(CheckpointManager(summary["checkpoint_url"]).path(2))
    assert (checkpoint / "hf" / "adapter" / "adapter_model.safetensors").is_file()
    # final/ is the merged model, and it is the initial model plus final/adapter/
    start = load_model(run_dir / "model_init")
    merged = load_model(final)
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), merged.parameters()))
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        want = PeftModel.from_pretrained(start, str(adapter)).eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
