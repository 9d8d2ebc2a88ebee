"""Build a tiny model from a preset, or load any causal LM (local folder or hub id).

Both routes end in a Hugging Face folder, so every later stage (SFT, the inference engine, the
learner, SGLang on a GPU node) loads the model the same way: ``from_pretrained(folder)``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from core.models.chat_template import add_chat_format
from core.models.presets import MODEL_PRESETS, is_preset
from core.models.tokenizer import save_tokenizer, train_tokenizer

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """Map a config dtype name to a torch dtype, naming the field on a bad value."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"model.dtype={name!r} is not one of {sorted(DTYPES)}") from None


def preset_config(preset: str, *, vocab_size: int, **token_ids: int | None) -> Qwen2Config:
    """The Qwen2 configuration of the named preset (``token_ids``: bos/eos/pad token ids)."""
    if not is_preset(preset):
        raise ValueError(f"model.path={preset!r} is not a preset; presets: {sorted(MODEL_PRESETS)}")
    arch = MODEL_PRESETS[preset]
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        intermediate_size=arch.intermediate_size,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        attn_implementation="sdpa",
        **token_ids,
    )


def build_tiny_model(
    preset: str, tokenizer: PreTrainedTokenizerBase, seed: int
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM of the named size (deterministic per seed)."""
    config = preset_config(
        preset,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("built %s Qwen2 model: %.2f M parameters", preset, n_params / 1e6)
    return model


def create_pretrained(
    preset: str,
    corpus: Iterable[str],
    directory: str | Path,
    *,
    vocab_size: int,
    seed: int,
    chat: bool = False,
) -> Path:
    """Train a tokenizer on ``corpus``, build the preset model and save both to ``directory``.
    ``chat``: the tokenizer also gets our chat format (:mod:`core.models.chat_template`)."""
    directory = Path(directory)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    if chat:
        add_chat_format(tokenizer)
    model = build_tiny_model(preset, tokenizer, seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    save_tokenizer(tokenizer, directory)
    model.generation_config.save_pretrained(str(directory))
    return directory


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a folder or hub id; batched generation needs left padding."""
    folder = Path(path)
    if folder.is_dir() and not any((folder / name).exists() for name in TOKENIZER_FILES):
        # transformers 5 silently builds an *empty* tokenizer from config.json alone.
        raise FileNotFoundError(
            f"no tokenizer files in {folder} (looked for {', '.join(TOKENIZER_FILES)})"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        # Many chat models ship without a pad token; eos is the conventional stand-in.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str | Path, *, dtype: str = "float32", attn_implementation: str = "sdpa"
) -> PreTrainedModel:
    """Load a causal LM from a folder or hub id with the configured dtype and attention."""
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch_dtype(dtype), attn_implementation=attn_implementation
    )
    model.eval()
    return model
