"""The inference model's attention on CPU: grouped key/value heads read in place under a mask."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache
from transformers.integrations import sdpa_attention

from core.inference.engine.hf_engine import HFEngine
from core.inference.engine.kv_batch import left_pad
from core.models import load_model
from core.models.attention import GROUPED_SDPA, inference_attention
from core.training.shared_prompts import cache_kwarg


def test_sdpa_becomes_grouped_on_cpu_only() -> None:
    assert inference_attention("sdpa", "cpu") == GROUPED_SDPA
    assert inference_attention("sdpa", "cuda") == "sdpa"
    assert inference_attention("eager", "cpu") == "eager"


def test_engine_loads_its_model_with_grouped_attention(model_dir: Path) -> None:
    engine = HFEngine.from_pretrained(model_dir, device="cpu", prefix_cache_tokens=0)
    try:
        assert engine.model.config._attn_implementation == GROUPED_SDPA
        assert engine.model.config.num_key_value_heads < engine.model.config.num_attention_heads
    finally:
        engine.close()


def test_continuation_logits_match_eager_attention_without_copying_heads(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape of an agent's next call: several new tokens per row over a left-padded cached
    prefix. Equal to eager attention's logits, and no key/value head copied (``repeat_kv``)."""
    copies = []
    real_repeat = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: copies.append(1) or real_repeat(*a))
    prefixes = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    suffixes = [[20, 21], [22, 23, 24, 25]]

    def logits(attention: str) -> torch.Tensor:
        model = load_model(model_dir, attn_implementation=attention)
        name = cache_kwarg(model)
        cache = DynamicCache(config=model.config)
        ids, mask, positions = left_pad(prefixes, 0, torch.device("cpu"))
        # both rows' new tokens right-aligned after their prefixes: pad the shorter suffix
        width = max(map(len, suffixes))
        new_ids = torch.tensor([[0] * (width - len(s)) + s for s in suffixes])
        new_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in suffixes])
        new_positions = torch.stack(
            [
                torch.arange(len(p) - width + len(s), len(p) + len(s)).clamp(min=0)
                for p, s in zip(prefixes, suffixes, strict=True)
            ]
        )
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=positions, **{name: cache})
            out = model(
                input_ids=new_ids,
                attention_mask=torch.cat([mask, new_mask], dim=1),
                position_ids=new_positions,
                **{name: cache},
            ).logits
        return torch.cat([out[0, -len(suffixes[0]) :], out[1, -len(suffixes[1]) :]])

    expected = logits("eager")
    copies.clear()
    got = logits(GROUPED_SDPA)
    assert not copies
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    assert logits("sdpa").shape == got.shape and copies  # plain sdpa does copy them
