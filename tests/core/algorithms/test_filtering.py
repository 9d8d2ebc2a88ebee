"""DAPO dynamic sampling filter."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.algorithms import filter_uniform_groups

pytestmark = pytest.mark.unit


def test_hand_case():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    keep, stats = filter_uniform_groups(rewards, 2)
    assert keep.tolist() == [False, False, True, True, False, False, False, False]
    assert stats == {"n_groups": 4, "n_kept": 1, "n_dropped": 3, "n_dropped_max": 1,
                     "n_dropped_min": 1}  # fmt: skip
    keep, _ = filter_uniform_groups(torch.tensor([1.0, 1.05]), 2, atol=0.1)
    assert not keep.any()
    with pytest.raises(ValueError, match="groups"):
        filter_uniform_groups(torch.zeros(3), 2)


@settings(max_examples=50, deadline=None)
@given(
    groups=st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=3, max_size=3), min_size=1,
                    max_size=10),
)  # fmt: skip
def test_keeps_exactly_the_informative_groups(groups):
    rewards = torch.tensor([r for g in groups for r in g])
    keep, stats = filter_uniform_groups(rewards, 3)
    for i, g in enumerate(groups):
        assert keep[3 * i : 3 * i + 3].tolist() == [len(set(g)) > 1] * 3
    assert stats["n_kept"] + stats["n_dropped"] == stats["n_groups"] == len(groups)
    assert stats["n_dropped"] == sum(len(set(g)) == 1 for g in groups)
