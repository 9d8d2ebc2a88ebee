"""ResumableDataLoader: endless epochs, reproducible shuffles, exact resume."""

from __future__ import annotations

import itertools
import json

import pytest

from core.data import ResumableDataLoader

pytestmark = pytest.mark.unit

DATA = [{"id": str(i), "question": f"q{i}", "answer": f"#### {i}"} for i in range(10)]


def _ids(batch: list[dict]) -> list[str]:
    return [s["id"] for s in batch]


def _stream(loader: ResumableDataLoader, n: int) -> list[list[str]]:
    return [_ids(loader.next_batch()) for _ in range(n)]


def test_batches_cover_each_epoch_and_reshuffle() -> None:
    loader = ResumableDataLoader(DATA, batch_size=3, seed=1)
    assert loader.batches_per_epoch == 3
    epochs = [_stream(loader, 3) for _ in range(3)]
    for epoch in epochs:
        flat = list(itertools.chain.from_iterable(epoch))
        assert len(flat) == 9 and len(set(flat)) == 9  # one sample dropped per epoch
    assert epochs[0] != epochs[1] != epochs[2]
    assert loader.epoch == 2 and loader.position == 9
    # The order depends only on (seed, epoch).
    again = ResumableDataLoader(DATA, batch_size=3, seed=1)
    assert [_stream(again, 3) for _ in range(3)] == epochs
    other = ResumableDataLoader(DATA, batch_size=3, seed=2)
    assert _stream(other, 3) != epochs[0]


def test_iter_and_no_shuffle_and_keep_last() -> None:
    loader = ResumableDataLoader(DATA, batch_size=4, shuffle=False, drop_last=False)
    assert loader.batches_per_epoch == 3
    batches = [_ids(b) for b in itertools.islice(loader, 4)]
    assert batches == [["0", "1", "2", "3"], ["4", "5", "6", "7"], ["8", "9"], ["0", "1", "2", "3"]]


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("k", [0, 2, 3, 4, 7])  # 3 = one epoch exactly with batch 3, drop_last
def test_resume_batches_exactly(k: int, drop_last: bool) -> None:
    reference = ResumableDataLoader(DATA, batch_size=3, seed=7, drop_last=drop_last)
    expected = _stream(reference, k + 6)

    loader = ResumableDataLoader(DATA, batch_size=3, seed=7, drop_last=drop_last)
    assert _stream(loader, k) == expected[:k]
    state = json.loads(json.dumps(loader.state_dict()))  # JSON round trip
    fresh = ResumableDataLoader(DATA, batch_size=3, seed=7, drop_last=drop_last)
    fresh.load_state_dict(state)
    assert (fresh.epoch, fresh.position) == (loader.epoch, loader.position)
    assert _stream(fresh, 6) == expected[k:]


def test_resume_with_single_samples_across_epoch_boundary() -> None:
    def draw(loader: ResumableDataLoader) -> list[str]:
        out = _ids(loader.next_samples(4))  # 4
        out += _ids(loader.next_samples(1))  # 5
        out += _ids(loader.next_batch())  # 8
        out += _ids(loader.next_samples(7))  # 15: crosses into epoch 1
        return out

    reference = ResumableDataLoader(DATA, batch_size=3, seed=3)
    expected = draw(reference) + draw(reference) + _ids(reference.next_samples(25))

    loader = ResumableDataLoader(DATA, batch_size=3, seed=3)
    first = draw(loader)
    assert loader.epoch == 1 and loader.position == 5
    state = loader.state_dict()
    fresh = ResumableDataLoader(DATA, batch_size=3, seed=3)
    fresh.load_state_dict(state)
    assert first + draw(fresh) + _ids(fresh.next_samples(25)) == expected
    # Single samples use every sample of an epoch, in the epoch's order.
    single = ResumableDataLoader(DATA, batch_size=3, seed=3)
    assert sorted(_ids(single.next_samples(10)), key=int) == [s["id"] for s in DATA]
    assert single.next_samples(0) == []


def test_load_adopts_saved_seed() -> None:
    loader = ResumableDataLoader(DATA, batch_size=2, seed=11)
    loader.next_batch()
    fresh = ResumableDataLoader(DATA, batch_size=2, seed=0)
    fresh.load_state_dict(loader.state_dict())
    assert _stream(fresh, 8) == _stream(loader, 8)


def test_state_dict_is_json_serialisable() -> None:
    loader = ResumableDataLoader(DATA, batch_size=2, seed=5)
    loader.next_samples(3)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state == {
        "epoch": 0,
        "position": 3,
        "seed": 5,
        "batch_size": 2,
        "dataset_len": 10,
        "shuffle": True,
        "drop_last": True,
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"dataset_len": 11}, "dataset_len"),
        ({"batch_size": 4}, "batch_size"),
        ({"shuffle": False}, "shuffle"),
        ({"position": 11}, "position"),
        ({"epoch": -1}, "epoch"),
    ],
)
def test_load_mismatch_names_field(change: dict, field: str) -> None:
    state = ResumableDataLoader(DATA, batch_size=2).state_dict() | change
    with pytest.raises(ValueError, match=field):
        ResumableDataLoader(DATA, batch_size=2).load_state_dict(state)


def test_load_missing_key_and_bad_construction() -> None:
    state = ResumableDataLoader(DATA, batch_size=2).state_dict()
    del state["epoch"]
    with pytest.raises(ValueError, match="epoch"):
        ResumableDataLoader(DATA, batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="empty"):
        ResumableDataLoader([], batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        ResumableDataLoader(DATA, batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        ResumableDataLoader(DATA, batch_size=11)
    assert len(ResumableDataLoader(DATA, batch_size=11, drop_last=False).next_batch()) == 10
