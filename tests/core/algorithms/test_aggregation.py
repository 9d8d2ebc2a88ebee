"""Loss aggregation modes and the global-normaliser contract."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import AGGREGATION_MODES, aggregate_loss, global_normalizer

pytestmark = pytest.mark.unit

LOSSES = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # third row: padding


def reference_aggregate(losses, mask, mode, norm_constant=None):
    """Straight loops over sequences and tokens, from the formulas."""
    seq_sums, seq_means, n_tokens = [], [], 0
    for i in range(losses.shape[0]):
        valid = [losses[i, t] for t in range(losses.shape[1]) if mask[i, t]]
        n_tokens += len(valid)
        if valid:
            seq_sums.append(sum(valid))
            seq_means.append(sum(valid) / len(valid))
    if mode == "token-mean":
        return sum(seq_sums) / n_tokens if n_tokens else torch.tensor(0.0)
    if not seq_sums:
        return torch.tensor(0.0)
    if mode == "seq-mean-token-sum":
        return sum(seq_sums) / len(seq_sums)
    if mode == "seq-mean-token-mean":
        return sum(seq_means) / len(seq_means)
    c = losses.shape[1] if norm_constant is None else norm_constant
    return sum(seq_sums) / (len(seq_sums) * c)


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 10 / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / (2 * 4)),
    ],
)
def test_hand_computed_modes(mode, expected):
    assert aggregate_loss(LOSSES, MASK, mode).item() == pytest.approx(expected)
    assert aggregate_loss(LOSSES, MASK.bool(), mode).item() == pytest.approx(expected)


def test_sum_norm_uses_the_constant():
    loss = aggregate_loss(LOSSES, MASK, "seq-mean-token-sum-norm", norm_constant=10)
    assert loss.item() == pytest.approx(10 / (2 * 10))


def test_global_normalizer_values_and_additivity():
    assert global_normalizer(MASK, "token-mean") == 4.0
    assert global_normalizer(MASK, "seq-mean-token-sum") == 2.0
    assert global_normalizer(MASK, "seq-mean-token-mean") == 2.0
    assert global_normalizer(MASK, "seq-mean-token-sum-norm") == 8.0
    assert global_normalizer(MASK, "seq-mean-token-sum-norm", norm_constant=3) == 6.0
    for mode in AGGREGATION_MODES:
        parts = [MASK[:1], MASK[1:]]
        assert global_normalizer(parts, mode) == global_normalizer(MASK, mode)
        assert global_normalizer(parts, mode) == sum(global_normalizer(p, mode) for p in parts)


def test_empty_mask_gives_zero_loss_with_a_graph():
    losses = torch.ones(2, 3, requires_grad=True)
    for mode in AGGREGATION_MODES:
        loss = aggregate_loss(losses, torch.zeros(2, 3), mode)
        assert loss.item() == 0.0
        loss.backward()
    assert torch.all(losses.grad == 0)


def test_errors():
    with pytest.raises(ValueError, match="aggregation mode"):
        aggregate_loss(LOSSES, MASK, "mean")
    with pytest.raises(ValueError, match="norm_constant"):
        global_normalizer([torch.ones(1, 3), torch.ones(1, 4)], "seq-mean-token-sum-norm")


def _random_case(seed, batch, tokens):
    gen = torch.Generator().manual_seed(seed)
    losses = torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    mask = torch.rand(batch, tokens, generator=gen) < 0.7
    return losses, mask


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 6),
    tokens=st.integers(1, 7),
    mode=st.sampled_from(AGGREGATION_MODES),
)
def test_matches_loop_reference(seed, batch, tokens, mode):
    losses, mask = _random_case(seed, batch, tokens)
    expected = float(reference_aggregate(losses, mask, mode))
    assert aggregate_loss(losses, mask, mode).item() == pytest.approx(expected, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 8),
    tokens=st.integers(1, 7),
    mode=st.sampled_from(AGGREGATION_MODES),
    data=st.data(),
)
def test_micro_batch_split_invariance(seed, batch, tokens, mode, data):
    """Summing micro-batch losses computed with the global normaliser == the unsplit loss."""
    losses, mask = _random_case(seed, batch, tokens)
    cuts = sorted(data.draw(st.sets(st.integers(1, batch - 1), max_size=3)) if batch > 1 else [])
    bounds = [0, *cuts, batch]
    chunks = [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    full_leaf = losses.clone().requires_grad_(True)
    full = aggregate_loss(full_leaf, mask, mode)
    full.backward()

    split_leaf = losses.clone().requires_grad_(True)
    norm = global_normalizer([mask[a:b] for a, b in chunks], mode, norm_constant=tokens)
    total = sum(
        aggregate_loss(split_leaf[a:b], mask[a:b], mode, normalizer=norm) for a, b in chunks
    )
    total.backward()
    assert torch.allclose(total, full)
    assert torch.allclose(split_leaf.grad, full_leaf.grad)
