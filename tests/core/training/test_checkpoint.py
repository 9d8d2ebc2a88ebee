"""Single process: HF export for weight publishing, and exact checkpoint round trips."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.training import Learner, checkpoint_complete
from tests.core.training.helpers import ADAM, make_batch

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def batch(tokenizer):
    return make_batch(tokenizer, 6, seed=9)


def _learner(model_dir) -> Learner:
    return Learner(model_dir, **ADAM, micro_batch_tokens=48)


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.full_state_dict().items()}


def test_export_hf_loads_with_from_pretrained(model_dir, batch, tmp_path) -> None:
    learner = _learner(model_dir)
    learner.sft_step(batch)
    out = learner.export_hf(tmp_path / "published" / "v1")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert "lm_head.weight" not in load_file(out / "model.safetensors")  # tied to the embedding
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert AutoTokenizer.from_pretrained(str(out)).pad_token == "<pad>"
    learner.model.eval()
    with torch.no_grad():
        args = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        torch.testing.assert_close(
            loaded(**args).logits, learner.model(**args).logits, atol=1e-6, rtol=0
        )
    learner.sft_step(batch)
    learner.export_hf(out)  # republishing replaces the folder
    assert not torch.equal(
        load_file(out / "model.safetensors")["model.norm.weight"], loaded.model.norm.weight
    )


def test_checkpoint_round_trip_is_exact(model_dir, batch, tmp_path) -> None:
    url = str(tmp_path / "ckpt")
    first = _learner(model_dir)
    for _ in range(2):
        first.sft_step(batch)
    first.version = 7
    first.save_checkpoint(url, extra={"data_position": 12})
    assert checkpoint_complete(url)
    expected = first.sft_step(batch)

    resumed = _learner(model_dir)
    assert resumed.load_checkpoint(url) == {"data_position": 12}
    assert (resumed.step, resumed.version) == (2, 7)
    got = resumed.sft_step(batch)
    for key in ("loss", "grad_norm", "lr"):
        assert got[key] == expected[key], key
    after, want = _weights(resumed), _weights(first)
    assert all(torch.equal(after[k], want[k]) for k in want)


def test_saving_before_the_first_step_changes_nothing(model_dir, batch, tmp_path) -> None:
    # get_state_dict initialises AdamW's state with a fake step; it must not leak into training.
    plain, saved = _learner(model_dir), _learner(model_dir)
    saved.save_checkpoint(str(tmp_path / "step0"))
    resumed = _learner(model_dir)
    resumed.load_checkpoint(str(tmp_path / "step0"))
    for learner in (plain, saved, resumed):
        for _ in range(2):
            learner.sft_step(batch)
    want = _weights(plain)
    for learner in (saved, resumed):
        got = _weights(learner)
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_missing_checkpoint_is_a_clear_error(model_dir, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        _learner(model_dir).load_checkpoint(str(tmp_path / "nothing"))
