"""Gumbel-max sampling and the counter-based hash behind per-request seeds.

Everything here is deterministic (seeded hash, seeded generator), so the statistical bounds are
checks that pass or fail the same way every run; they are set where a correct sampler passes with
a wide margin and a wrong temperature, truncation or a weak hash fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from core.inference.api import SamplingParams
from core.inference.engine.sampling import (
    BatchSampling,
    counter_hash,
    fmix32,
    gumbel_,
    sample_next,
    seeded_uniforms,
    split_seed,
    validate_sampling,
)

pytestmark = pytest.mark.unit

M32 = 0xFFFFFFFF
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
CPU = torch.device("cpu")


def py_fmix32(h: int) -> int:
    """Murmur3's fmix32 on Python ints (the reference a C or Rust port would follow)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def py_counter_hash(seed: int, position: int, index: int) -> int:
    lo, hi = seed % 2**64 & M32, seed % 2**64 >> 32
    key = py_fmix32(py_fmix32(py_fmix32(lo ^ 0x9E3779B9) ^ hi) ^ position)
    return py_fmix32(key ^ py_fmix32(index ^ 0x7F4A7C15))


def hash_triples(seeds: list[int], positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """counter_hash over seeds x positions x index, flattened."""
    halves = torch.tensor([split_seed(s) for s in seeds])
    lo, hi = halves[:, 0, None, None], halves[:, 1, None, None]
    return counter_hash(lo, hi, positions[None, :, None], index[None, None, :]).flatten()


def test_fmix32_and_counter_hash_match_a_plain_integer_reference() -> None:
    """No int64 overflow anywhere: the tensor hash equals exact modular arithmetic."""
    edge = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, M32 - 1, M32]
    values = (
        edge + torch.randint(0, 2**32, (500,), generator=torch.Generator().manual_seed(0)).tolist()
    )
    assert fmix32(torch.tensor(values)).tolist() == [py_fmix32(v) for v in values]
    triples = [(0, 0, 0), (-1, 7, 3), (2**64 - 1, 2**32 - 1, 151_935), (2**63, 12, 5)]
    triples += [(12345, 17, 299), (2**32, 17, 299), (1, 17, 299)]
    for seed, position, index in triples:
        lo, hi = split_seed(seed)
        got = counter_hash(*(torch.tensor([v]) for v in (lo, hi, position, index)))
        assert got.item() == py_counter_hash(seed, position, index)


def test_counter_hash_is_deterministic_in_range_and_collision_free_per_row() -> None:
    vocab = torch.arange(151_936)  # Qwen2's vocabulary size
    a = hash_triples([42], torch.tensor([1000]), vocab)
    assert torch.equal(a, hash_triples([42], torch.tensor([1000]), vocab))
    assert a.min() >= 0 and a.max() <= M32
    # for one (seed, position) the index -> hash map is a bijection: no shared uniforms in a row
    assert a.unique().numel() == vocab.numel()


def test_counter_hash_collisions_across_rows_are_at_the_random_rate() -> None:
    """1e5 near-identical triples (seeds 0..4 and their 2**32 / 2**63 twins, consecutive
    positions and indices): an additive or xor combiner would collide thousands of times. A
    random 32-bit function gives ~n^2 / 2^33 = 1.2 colliding pairs; more than 8 has odds < 1e-5.
    """
    seeds = [0, 1, 2, 3, 4, 2**32, 2**32 + 1, 2**63, 2**63 + 1, -1]
    values = hash_triples(seeds, torch.arange(100), torch.arange(100))
    assert values.numel() == 100_000
    assert values.numel() - values.unique().numel() <= 8
    # seeds that differ only in their high half (or sign) are different streams
    u = seeded_uniforms(
        torch.tensor([split_seed(s) for s in (5, 5 + 2**32, -5)]),
        torch.zeros(3, dtype=torch.long),
        64,
    )
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])


def test_seeded_uniforms_look_uniform_and_independent() -> None:
    seeds = torch.tensor([split_seed(s) for s in range(20)]).repeat_interleave(10, 0)
    positions = torch.arange(10).repeat(20) + 37
    u = seeded_uniforms(seeds, positions, 500)  # [200, 500]: 1e5 uniforms
    flat = u.flatten()
    n = flat.numel()
    assert u.dtype == torch.float64 and 0 < flat.min() and flat.max() < 1
    assert abs(flat.mean().item() - 0.5) < 4 * math.sqrt(1 / 12 / n)
    ks = (flat.sort().values - torch.arange(1, n + 1, dtype=torch.float64) / n).abs().max()
    assert ks.item() < 1.95 / math.sqrt(n)  # Kolmogorov-Smirnov, alpha = 0.001
    # neighbouring positions (same seed, same index) and neighbouring indices are uncorrelated
    by_position = u.reshape(20, 10, 500)
    for x, y in ((by_position[:, :-1], by_position[:, 1:]), (u[:, :-1], u[:, 1:])):
        corr = torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1]
        assert abs(corr.item()) < 4 / math.sqrt(x.numel())


def expected_probs(temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """softmax(LOGITS / T) renormalised over the top-k / top-p survivors (LOGITS is sorted)."""
    probs = torch.softmax(LOGITS.double() / temperature, -1)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    before = 0.0
    for i, p in enumerate(probs.tolist()):
        keep[i] = (top_k == 0 or i < top_k) and before <= top_p
        before += p
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum()


def chi2_bound(dof: int, z: float = 3.719) -> float:
    """Upper 1e-4 quantile of chi-square with ``dof`` degrees (Wilson-Hilferty)."""
    c = 2 / (9 * dof)
    return dof * (1 - c + z * math.sqrt(c)) ** 3


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "generator"])
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.3, 0, 0.8), (0.7, 5, 0.9)],
)
def test_gumbel_sampling_follows_the_truncated_softmax(seeded, temperature, top_k, top_p) -> None:
    n_seeds, n_positions = 100, 200  # 20k draws, each from its own (seed, position)
    params = [
        SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, seed=s if seeded else None
        )
        for s in range(n_seeds)
        for _ in range(n_positions)
    ]
    sampling = BatchSampling.from_params(params, LOGITS.numel(), CPU)
    positions = torch.arange(n_positions).repeat(n_seeds) + 11
    logits = LOGITS.expand(len(params), -1)
    tokens, logprobs = sample_next(logits, sampling, torch.Generator().manual_seed(0), positions)
    counts = torch.bincount(tokens, minlength=LOGITS.numel()).double()
    expected = expected_probs(temperature, top_k, top_p) * len(params)
    support = expected > 0
    assert counts[~support].sum() == 0  # truncated tokens never appear
    chi2 = ((counts[support] - expected[support]) ** 2 / expected[support]).sum().item()
    assert chi2 < chi2_bound(int(support.sum()) - 1), (counts.tolist(), expected.tolist())
    # the logprob is log_softmax(logits / T) before truncation, at the chosen token
    full = torch.log_softmax(LOGITS / temperature, -1)
    torch.testing.assert_close(logprobs, full[tokens], atol=1e-6, rtol=0)


def test_a_seeded_row_ignores_its_batch_and_the_generator() -> None:
    """Same (seed, position, logits) -> same token, whatever else is sampled alongside."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(1)) * 2
    target = SamplingParams(temperature=0.9, top_k=40, seed=2024)
    others = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=7),
        SamplingParams(temperature=0.5, top_p=0.5),
        SamplingParams(temperature=1.2, seed=2024),
    ]
    for position in range(20, 60):
        alone, _ = sample_next(
            logits[:1],
            BatchSampling.from_params([target], 300, CPU),
            torch.Generator().manual_seed(0),
            torch.tensor([position]),
        )
        batch, _ = sample_next(
            logits[[1, 0, 2, 3, 4, 5]],  # the target is row 1 here
            BatchSampling.from_params([others[0], target, *others[1:]], 300, CPU),
            torch.Generator().manual_seed(position),
            torch.tensor([5, position, 9, 300, 2, position]),
        )
        assert alone.item() == batch[1].item()


def test_public_pieces_reproduce_the_engine_pick() -> None:
    """What a reference implementation writes (seeded_uniforms + gumbel_ + argmax) picks the
    same tokens as sample_next, bit for bit."""
    logits = torch.randn(64, 300, generator=torch.Generator().manual_seed(2)) * 3
    seeds = [2**62 + i for i in range(64)]
    positions = torch.arange(64) * 7 + 3
    sampling = BatchSampling.from_params(
        [SamplingParams(temperature=0.8, seed=s) for s in seeds], 300, CPU
    )
    tokens, _ = sample_next(logits, sampling, torch.Generator(), positions)
    scaled = logits.float() / 0.8
    noise = gumbel_(seeded_uniforms(torch.tensor([split_seed(s) for s in seeds]), positions, 300))
    assert torch.equal(tokens, (scaled.double() + noise).argmax(dim=-1))


def test_seeded_sampling_leaves_the_generator_alone_and_positions_matter() -> None:
    logits = torch.zeros(1, 1000)  # uniform: the token is the noise's argmax
    sampling = BatchSampling.from_params([SamplingParams(seed=3)], 1000, CPU)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    tokens = [
        sample_next(logits, sampling, generator, torch.tensor([p]))[0].item() for p in range(50)
    ]
    assert torch.equal(generator.get_state(), state)
    assert len(set(tokens)) > 40  # a fresh draw at every position


def test_seed_validation_and_splitting() -> None:
    assert split_seed(0) == (0, 0) and split_seed(-1) == (M32, M32)
    assert split_seed(2**32 + 5) == (5, 1) and split_seed(2**64 + 5) == (5, 0)
    validate_sampling(SamplingParams(seed=-3))
    for bad in ("7", 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            validate_sampling(SamplingParams(seed=bad))  # type: ignore[arg-type]
