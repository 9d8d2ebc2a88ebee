"""Named sizes of the Qwen2-architecture model we build from scratch for CPU runs.

Measured on 2 CPU cores (see STACK-NOTES): ``tiny`` does SFT at ~5-6k tokens/s and learns
1-2 step arithmetic word problems in a few minutes; ``small`` is for a laptop with patience;
``medium`` (~100 M) sizes weight-transfer benchmarks and is too slow to train on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    """Architecture of a from-scratch Qwen2 model (vocabulary size comes from the tokenizer)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    # The context length: rotary positions have no parameters, so this changes no weights; 2048
    # fits a solved multi-hop search episode (~1k tokens) with room to spare.
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True


MODEL_PRESETS: dict[str, ModelPreset] = {
    # ~1.0 M parameters with a 400-token vocabulary.
    "tiny": ModelPreset(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    ),
    # ~9.9 M parameters with a 400-token vocabulary.
    "small": ModelPreset(
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=1024,
    ),
    # ~97 M parameters with a 400-token vocabulary: a GPT-2-small-sized model, to measure what
    # moving ~400 MB of float32 weights costs (experiments/benchmarks/weight_sync.py), not to train.
    "medium": ModelPreset(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2816,
    ),
}


def is_preset(name: str) -> bool:
    """True when ``name`` names a from-scratch preset rather than a hub id or a folder."""
    return name in MODEL_PRESETS
