"""LoRA through peft: only the adapters train, the engines get merged weights, checkpoints hold
the adapter, the KL reference is the adapter-free base, and two FSDP2 ranks match one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from peft import PeftModel
from transformers import AutoModelForCausalLM

from core.config import ConfigError, load_config
from core.models import load_model
from core.training import Learner, LoraSpec, spawn_local
from tests.core.training.helpers import (
    ADAM,
    SGD_LIKE,
    lora_suite,
    make_batch,
    max_abs_diff,
    ppo_batch,
    ppo_runs,
)

LORA = LoraSpec(rank=4, alpha=8.0)  # scale alpha / r = 2
N_ADAPTER_TENSORS = 4 * 7 * 2  # tiny: 4 layers x 7 linear modules x (A, B)


@pytest.fixture(scope="module")
def batch(tokenizer):
    return make_batch(tokenizer, 6, seed=9)


def _learner(model_dir: Path, lora: LoraSpec | None = LORA, **kw) -> Learner:
    return Learner(model_dir, **ADAM, micro_batch_tokens=48, lora=lora, **kw)


def _params(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters()}


def _trainable(learner: Learner) -> set[str]:
    return {n for n, p in learner.model.named_parameters() if p.requires_grad}


def _logits(model: torch.nn.Module, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


@pytest.mark.unit
def test_only_the_adapters_train(model_dir, batch) -> None:
    rng = torch.get_rng_state()
    learner = _learner(model_dir)
    assert torch.equal(torch.get_rng_state(), rng)  # A's init comes from the learner's seed
    # ... so every FSDP rank starts from the same adapters
    assert max_abs_diff(_params(learner), _params(_learner(model_dir))) == 0
    trainable = _trainable(learner)
    assert len(trainable) == N_ADAPTER_TENSORS
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)
    optimised = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for n, p in learner.model.named_parameters() if n in trainable}
    before = _params(learner)
    for _ in range(2):
        learner.sft_step(batch)
    after = _params(learner)
    frozen = [n for n in before if n not in trainable]
    assert len(frozen) == len(list(load_model(model_dir).parameters()))  # every base weight
    assert all(torch.equal(after[n], before[n]) for n in frozen)  # the base, bit for bit
    # B starts at 0, so A moves from the second step on; after two steps every adapter has.
    assert all(not torch.equal(after[n], before[n]) for n in trainable)


@pytest.mark.unit
def test_engines_get_the_merged_weights(model_dir, batch, tmp_path) -> None:
    learner = _learner(model_dir)
    for _ in range(2):
        learner.sft_step(batch)
    want = _logits(learner.model, batch)
    before = _params(learner)

    merged = learner.full_state_dict()
    base = load_model(model_dir)
    assert merged.keys() == base.state_dict().keys()  # the base model's HF names
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], base.state_dict()[q])
    base.load_state_dict(merged)
    got = _logits(base, batch)
    print(f"merged vs adapted logits: max |d| = {float((got - want).abs().max()):.2e}")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    out = learner.export_hf(tmp_path / "published" / "v1")
    torch.testing.assert_close(
        _logits(AutoModelForCausalLM.from_pretrained(str(out)), batch), want, atol=1e-5, rtol=0
    )
    adapter = out / "adapter"
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {
        p.name for p in adapter.iterdir()
    }
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    assert config["base_model_name_or_path"] == str(model_dir)
    reloaded = PeftModel.from_pretrained(load_model(model_dir), str(adapter))
    torch.testing.assert_close(_logits(reloaded, batch), want, atol=1e-6, rtol=0)
    # exporting merged a copy: the training model still holds base + adapters
    after = _params(learner)
    assert all(torch.equal(after[n], before[n]) for n in before)


@pytest.mark.unit
def test_the_kl_reference_is_the_base_with_adapters_off(model_dir, batch) -> None:
    learner = _learner(model_dir, reference_model_dir=model_dir)
    assert learner.reference is None  # no second copy of the model
    base = _learner(model_dir, lora=None).compute_logprobs(batch)
    trainable = _trainable(learner)
    for _ in range(2):
        learner.sft_step(batch)
    torch.testing.assert_close(learner.compute_reference_logprobs(batch), base, atol=0, rtol=0)
    assert not torch.equal(learner.compute_logprobs(batch), base)
    # disabling the adapters for the reference pass leaves them trainable
    assert _trainable(learner) == trainable
    before = _params(learner)
    learner.sft_step(batch)
    after = _params(learner)
    assert all(not torch.equal(after[n], before[n]) for n in trainable)


@pytest.mark.unit
def test_lora_checkpoint_holds_the_adapter_and_resumes_exactly(model_dir, batch, tmp_path) -> None:
    url = str(tmp_path / "ckpt")
    first = _learner(model_dir)
    for _ in range(2):
        first.sft_step(batch)
    first.version = 5
    first.save_checkpoint(url, extra={"k": 1})
    saved = dcp.FileSystemReader(url).read_metadata().state_dict_metadata
    model_keys = {k for k in saved if k.startswith("model.")}
    assert len(model_keys) == N_ADAPTER_TENSORS and all(".lora_" in k for k in model_keys)
    assert any(k.startswith("optim.state.") and k.endswith("exp_avg_sq") for k in saved)
    expected = first.sft_step(batch)

    resumed = _learner(model_dir)
    assert resumed.load_checkpoint(url) == {"k": 1}
    assert (resumed.step, resumed.version) == (2, 5)
    got = resumed.sft_step(batch)
    for key in ("loss", "grad_norm", "lr"):
        assert got[key] == expected[key], key
    want, have = first.full_state_dict(), resumed.full_state_dict()
    assert all(torch.equal(have[k], want[k]) for k in want)

    with pytest.raises(ValueError, match="LoRA off .* set model.lora_"):
        _learner(model_dir, lora=None).load_checkpoint(url)
    with pytest.raises(ValueError, match="rank=4.*rank=8"):
        _learner(model_dir, lora=LoraSpec(rank=8, alpha=8.0)).load_checkpoint(url)


@pytest.mark.unit
def test_a_critic_takes_no_adapters(model_dir) -> None:
    with pytest.raises(ValueError, match="critic .* trains all its weights"):
        Learner(model_dir, **ADAM, micro_batch_tokens=48, with_value_head=True, lora=LORA)
    with pytest.raises(ValueError, match="model.lora_rank must be >= 1"):
        LoraSpec(rank=0, alpha=8.0)


@pytest.mark.integration
def test_two_ranks_with_lora_match_one_process(model_dir, tokenizer, tmp_path) -> None:
    batch = ppo_batch(model_dir, tokenizer, 8)
    # PPO with a KL term: the reference pass disables the adapters of the sharded model.
    runs = [dict(learner_kw=dict(SGD_LIKE, lora=LORA), micro_batch_tokens=64)]
    url, export = str(tmp_path / "ckpt"), tmp_path / "export"
    ranks = spawn_local(lora_suite, 2, model_dir, batch, runs, url, LORA, str(export))
    (one,) = ppo_runs(model_dir, batch, [dict(runs[0], micro_batch_tokens=10_000)])
    two = ranks[0]["ppo"][0]
    assert two["sharded"] and two["rows"] == 4
    for a, b in zip(one["stats"], two["stats"]):
        for key in ("loss", "policy_loss", "kl", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert two["stats"][1]["kl"] > 0  # the adapters moved the policy off the reference
    diff = max_abs_diff(one["state"], two["state"])
    print(f"LoRA, 1 vs 2 ranks: max |dw| of the merged weights = {diff:.2e}")
    assert diff <= 1e-6

    ckpt = ranks[0]["checkpoint"]
    assert ckpt["counters"] == (2, 3)
    for key in ("loss", "grad_norm", "lr"):
        assert ckpt["got"][key] == ckpt["expected"][key], key
    assert all(torch.equal(ckpt["have"][k], ckpt["want"][k]) for k in ckpt["want"])
    # DCP reshards: the 2-rank adapter checkpoint loads into one plain process.
    single = Learner(model_dir, **ADAM, micro_batch_tokens=48, lora=LORA)
    single.load_checkpoint(url)
    state = single.full_state_dict()
    assert all(torch.equal(state[k], ckpt["saved"][k]) for k in ckpt["saved"])
    # rank 0 writes the adapter of the sharded model next to the merged weights
    merged = AutoModelForCausalLM.from_pretrained(str(export))
    adapted = PeftModel.from_pretrained(load_model(model_dir), str(export / "adapter"))
    want = _logits(adapted, batch)
    assert not torch.equal(want, _logits(load_model(model_dir), batch))
    torch.testing.assert_close(_logits(merged, batch), want, atol=1e-5, rtol=0)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lora_rank=-1"], r"model.lora_rank must be >= 0"),
        (["model.lora_alpha=0"], r"model.lora_alpha must be > 0"),
        (["model.lora_dropout=1.0"], r"model.lora_dropout must be in \[0, 1\)"),
        (
            ["model.lora_target_modules=[q_proj,qproj]"],
            r"'qproj' matches no module; the model's linear modules: down_proj, gate_proj, "
            r"k_proj, o_proj, q_proj, up_proj, v_proj",
        ),
        (["model.lora_target_modules=[lm_head]"], r"'lm_head' selects lm_head, not an adaptable"),
        (["model.lora_target_modules=[all-linear,q_proj]"], r"'all-linear' stands alone"),
        (["model.lora_target_modules=[]"], r"model.lora_target_modules is empty"),
    ],
)
def test_bad_lora_settings_fail_when_the_config_loads(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.lora_rank=4", *overrides])


@pytest.mark.unit
def test_lora_targets_are_checked_against_a_model_folder(model_dir) -> None:
    ok = load_config(None, [f"model.path={model_dir}", "model.lora_rank=4",
                            "model.lora_target_modules=[self_attn.q_proj,v_proj]"])  # fmt: skip
    assert ok.model.lora_target_modules == ["self_attn.q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="'wq' matches no module"):
        load_config(None, [f"model.path={model_dir}", "model.lora_rank=4",
                           "model.lora_target_modules=[wq]"])  # fmt: skip
