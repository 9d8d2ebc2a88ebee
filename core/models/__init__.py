"""Tokenizers and models: tiny presets built locally, any HF causal LM loaded by path or id."""

from core.models.builder import (
    build_tiny_model,
    create_pretrained,
    load_model,
    load_tokenizer,
    torch_dtype,
)
from core.models.presets import MODEL_PRESETS, ModelPreset, is_preset
from core.models.tokenizer import SPECIAL_TOKENS, train_tokenizer
from core.models.value_model import ValueModel, last_token_values

__all__ = [
    "MODEL_PRESETS",
    "SPECIAL_TOKENS",
    "ValueModel",
    "last_token_values",
    "ModelPreset",
    "build_tiny_model",
    "create_pretrained",
    "is_preset",
    "load_model",
    "load_tokenizer",
    "torch_dtype",
    "train_tokenizer",
]
