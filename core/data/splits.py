"""Train and held-out sets from a generator's deterministic stream of samples (the synthetic
math and code tasks): the first ``n`` of a split, and a test set with no question from train."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator
from itertools import islice

logger = logging.getLogger(__name__)

# split name -> (index, sample) forever; the same stream for the same split and seed.
SampleStream = Callable[[str], Iterator[tuple[int, dict]]]


def first_samples(stream: SampleStream, n: int, split: str) -> list[dict]:
    """The first ``n`` samples of ``split``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [sample for _, sample in islice(stream(split), n)] if n else []


def fresh_episodes(
    episodes: Callable[[str], Iterable[dict]], n_train: int, n_test: int, widen: str
) -> tuple[list[dict], list[dict]]:
    """:func:`fresh_splits` for an agent environment, whose ``episodes(split)`` yields samples:
    a held-out episode repeats no training one's opening question *and* the state it runs
    against (the ``answer`` field: files, orders)."""
    return fresh_splits(
        lambda split: enumerate(episodes(split)),
        n_train,
        n_test,
        widen,
        key=lambda sample: (sample["question"], sample["answer"]),
    )


def fresh_splits(
    stream: SampleStream,
    n_train: int,
    n_test: int,
    widen: str,
    key: Callable[[dict], Hashable] = lambda row: row["question"],
) -> tuple[list[dict], list[dict]]:
    """``n_train`` training samples and ``n_test`` test samples whose ``key`` (the question; an
    agent environment's also its state) is not in train (nor twice in test), so test ids may
    skip indices. Raises ValueError, suggesting ``widen``, when the problem space is too small
    to find ``n_test`` fresh samples."""
    train = first_samples(stream, n_train, "train")
    seen = {key(row) for row in train}
    test: list[dict] = []
    n_skipped = 0
    max_tries = 100 * n_test + 10_000
    for i, sample in stream("test") if n_test > 0 else ():
        if i >= max_tries:
            raise ValueError(
                f"found only {len(test)} of {n_test} test questions not in train after "
                f"{max_tries} tries; {widen}"
            )
        sample_key = key(sample)
        if sample_key in seen:
            n_skipped += 1
            continue
        seen.add(sample_key)
        test.append(sample)
        if len(test) == n_test:
            break
    if n_skipped:
        logger.debug("skipped %d repeated test questions", n_skipped)
    return train, test
