"""The decoding batch's cache: appends in place, rows leave and join, contents stay exact."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from core.inference.engine import kv_batch
from core.inference.engine.kv_batch import GrowingLayer, LiveBatch, growing_cache, left_pad
from core.training.shared_prompts import cache_kwarg


def kv(batch: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, tokens, 8, generator=g), torch.randn(
        batch, 2, tokens, 8, generator=g
    )


def test_appends_write_in_place_and_match_concatenation() -> None:
    layer, reference = GrowingLayer(), DynamicLayer()
    buffers = set()
    for step in range(3 * GrowingLayer.spare):
        k, v = kv(3, 5 if step == 0 else 1, step)
        got, expected = layer.update(k, v), reference.update(k, v)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        buffers.add(layer.keys.untyped_storage().data_ptr())
    assert layer.get_seq_length() == reference.get_seq_length() == 5 + 3 * GrowingLayer.spare - 1
    # 191 one-column appends moved buffers only a few times (each move leaves >= 64 spare)
    assert len(buffers) <= 4


def test_rows_leaving_and_joining_a_grown_batch() -> None:
    """``LiveBatch.select``/``extend`` assign keys and values one after the other; each must
    keep its own columns (a shared fill count once cut the values to the keys' new width)."""

    def batch(layer_type: type) -> LiveBatch:
        cache = DynamicCache()
        cache.layers = [layer_type()]
        k, v = kv(3, 6, 0)
        cache.update(k, v, 0)
        for step in range(4):  # grow: the buffer now has spare columns
            cache.update(*kv(3, 1, step + 1), 0)
        mask = torch.ones(3, 10, dtype=torch.long)
        mask[0, :3] = 0  # row 0 started later: its first columns are padding
        return LiveBatch(["a", "b", "c"], cache, mask, torch.zeros(3, 1, dtype=torch.long))

    def joining(layer_type: type) -> LiveBatch:
        cache = DynamicCache()
        cache.layers = [layer_type()]
        cache.update(*kv(2, 12, 9), 0)
        return LiveBatch(["d", "e"], cache, torch.ones(2, 12, dtype=torch.long), torch.zeros(2, 1))

    grown, plain = batch(GrowingLayer), batch(DynamicLayer)
    for live in (grown, plain):
        live.select([0])  # only the padded row stays: its 3 padding columns are trimmed
        live.extend(joining(type(live.cache.layers[0])))
        live.cache.update(*kv(3, 1, 99), 0)
    assert grown.rows == plain.rows == ["a", "d", "e"]
    (g,), (p,) = grown.cache.layers, plain.cache.layers
    assert g.keys.shape == p.keys.shape == (3, 2, 13, 8)
    torch.testing.assert_close(g.keys, p.keys, rtol=0, atol=0)
    torch.testing.assert_close(g.values, p.values, rtol=0, atol=0)


def test_rows_leave_and_join_with_one_copy_into_room_for_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``select`` and ``extend`` each copy the cache once, into a buffer that the next decode
    steps append to in place; padding before a shorter row is zeros, not the buffer's garbage
    (masked, but ``0 * NaN`` in attention is still NaN)."""
    real = kv_batch.roomy_buffer
    monkeypatch.setattr(kv_batch, "roomy_buffer", lambda *a: real(*a).fill_(float("nan")))
    cache = DynamicCache()
    cache.layers = [GrowingLayer()]
    cache.update(*kv(3, 10, 0), 0)
    live = LiveBatch(["a", "b", "c"], cache, torch.ones(3, 10, dtype=torch.long), torch.zeros(3, 1))
    other_cache = DynamicCache()
    other_cache.layers = [GrowingLayer()]
    short_k, short_v = kv(2, 4, 1)
    other_cache.update(short_k, short_v, 0)
    other = LiveBatch(
        ["d", "e"], other_cache, torch.ones(2, 4, dtype=torch.long), torch.zeros(2, 1)
    )
    kept_k = cache.layers[0].keys[[0, 2]].clone()

    live.select([0, 2])
    live.extend(other)
    (layer,) = live.cache.layers
    assert live.rows == ["a", "c", "d", "e"] and layer.keys.shape == (4, 2, 10, 8)
    torch.testing.assert_close(layer.keys[:2], kept_k, rtol=0, atol=0)
    torch.testing.assert_close(layer.keys[2:, :, 6:], short_k, rtol=0, atol=0)
    assert torch.equal(layer.keys[2:, :, :6], torch.zeros(2, 2, 6, 8))
    assert torch.equal(layer.values[2:, :, :6], torch.zeros(2, 2, 6, 8))
    assert not layer.values.isnan().any()
    storage = layer.keys.untyped_storage().data_ptr()
    for step in range(GrowingLayer.spare):
        layer.update(*kv(4, 1, step + 2))
    assert layer.keys.untyped_storage().data_ptr() == storage  # no move while there was room


def test_model_decodes_the_same_with_a_growing_cache(ref_model) -> None:
    """Left-padded rows, one decode step at a time, then a row leaves and the rest go on."""
    sequences = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    name = cache_kwarg(ref_model)  # ``cache`` in transformers 5.2x, ``past_key_values`` before

    def decode(cache: DynamicCache) -> list[torch.Tensor]:
        ids, mask, positions = left_pad(sequences, 0, torch.device("cpu"))
        live = LiveBatch([0, 1], cache, mask, positions[:, -1:])
        with torch.no_grad():
            logits = ref_model(
                input_ids=ids, attention_mask=mask, position_ids=positions, **{name: cache}
            ).logits[:, -1]
            out = [logits]
            for step in range(2 * GrowingLayer.spare):
                if step == 40:
                    live.select([1])
                    logits = logits[1:]
                ids, mask, positions = live.advance(logits.argmax(-1))
                logits = ref_model(
                    input_ids=ids, attention_mask=mask, position_ids=positions, **{name: live.cache}
                ).logits[:, -1]
                out.append(logits)
        return out

    cache = growing_cache(ref_model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    grown, plain = decode(cache), decode(DynamicCache(config=ref_model.config))
    for got, expected in zip(grown, plain, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
