"""Tokenizer and tiny-model builders: sizes, determinism, and the save → from_pretrained round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.models import (
    MODEL_PRESETS,
    build_tiny_model,
    create_pretrained,
    load_model,
    load_tokenizer,
    train_tokenizer,
)

pytestmark = pytest.mark.unit

CORPUS = [
    "Question: Finn has 7 beads. He gives away 2. How many beads does Finn have now?\nAnswer: "
    "Finn has 7-2=<<7-2=5>>5 beads.\n#### 5",
    "Question: Ada has 12 shells. She finds 30 more. How many shells does Ada have?\nAnswer: #### 42",
] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300)


def test_tokenizer_special_tokens_and_digit_split(tokenizer) -> None:
    assert (
        tokenizer.pad_token == "<pad>"
        and tokenizer.eos_token == "<eos>"
        and tokenizer.bos_token == "<bos>"
    )
    assert len({tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id}) == 3
    tokens = tokenizer.tokenize("1234")
    assert [t.lstrip("Ġ") for t in tokens] == ["1", "2", "3", "4"]


def test_tokenizer_round_trips_unseen_text(tokenizer) -> None:
    text = "Zoë paid $1,234.50 — 15% off! ∑ <<3*4=12>> #### -7"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_tokenizer_is_deterministic() -> None:
    a = train_tokenizer(CORPUS, vocab_size=300)
    b = train_tokenizer(CORPUS, vocab_size=300)
    assert a.get_vocab() == b.get_vocab()


def test_tokenizer_rejects_tiny_vocab() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(CORPUS, vocab_size=100)


@pytest.mark.parametrize(("preset", "low", "high"), [("tiny", 0.8e6, 1.3e6), ("small", 8e6, 12e6)])
def test_preset_sizes(tokenizer, preset: str, low: float, high: float) -> None:
    model = build_tiny_model(preset, tokenizer, seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert low < n < high, n
    assert model.config.num_hidden_layers == MODEL_PRESETS[preset].num_hidden_layers


def test_model_init_is_deterministic_per_seed(tokenizer) -> None:
    a, b, c = (build_tiny_model("tiny", tokenizer, seed=s) for s in (3, 3, 4))
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)


def test_unknown_preset(tokenizer) -> None:
    with pytest.raises(ValueError, match="model.path='huge'"):
        build_tiny_model("huge", tokenizer, seed=0)


def test_save_and_from_pretrained_round_trip(tmp_path: Path) -> None:
    folder = create_pretrained("tiny", CORPUS, tmp_path / "m", vocab_size=300, seed=0)
    # the plain Hugging Face entry points load what we saved (the hub-loading code path)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    ours = load_model(folder)
    ours_tok = load_tokenizer(folder)
    assert ours_tok.padding_side == "left"
    assert tok.get_vocab() == ours_tok.get_vocab()
    ids = tok("Finn has 7 beads.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, ours(ids).logits)
    # generation works and stops on our eos id
    out = ours.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids.shape[1] + 5


def test_load_model_rejects_bad_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model.dtype='fp8'"):
        load_model(tmp_path, dtype="fp8")


def test_load_tokenizer_refuses_a_folder_without_one(tmp_path: Path) -> None:
    folder = create_pretrained("tiny", CORPUS, tmp_path / "m", vocab_size=300, seed=0)
    load_model(folder).save_pretrained(tmp_path / "weights_only")
    with pytest.raises(FileNotFoundError, match="no tokenizer files in .*weights_only"):
        load_tokenizer(tmp_path / "weights_only")
