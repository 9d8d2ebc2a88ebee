"""Data sources by name: ``data.source`` picks the function that makes a run's problems.

A source is a function ``(data config, seed) -> Splits`` registered with :func:`data_source`:
generated ones (``synthetic``, ``code_synthetic``, ``reasoning_gym``; ``search_synthetic``,
``textarena``, ``customer_service`` and ``terminal`` registered in core/workflows/ beside their
environments) and loaded ones (``gsm8k``, ``humaneval``, ``dataset``).
``data.source`` also takes a ``"module.sub:function"`` path to a source of the user's own::

    @data_source("my_puzzles", generated=True)
    def my_puzzles(data, seed: int) -> Splits:
        rows = [{"id": f"p{i}", "question": ..., "answer": ...} for i in range(data.n_train + data.n_test)]
        return Splits(rows[data.n_test:], rows[: data.n_test])

The pipeline (core/runtime/stages.py ``prepare_data``) calls it once per data config and caches
the result; config validation asks the registry whether the name exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.data.code_synthetic import generate_code_splits
from core.data.gsm8k import load_gsm8k
from core.data.humaneval import humaneval_splits
from core.data.reasoning_gym import reasoning_gym_splits
from core.data.reasoning_gym import spec_problems as reasoning_gym_problems
from core.data.synthetic import generate_splits
from core.data.tabular import Columns, load_table, remove_test_questions, split_by_ratio, to_samples
from core.plugins import Registry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Splits:
    """A source's problems: training and held-out samples, and notes on what it dropped."""

    train: list[dict]
    test: list[dict]
    notes: dict[str, Any] = field(default_factory=dict)


# The run's ``data`` section (core.config.sections.DataConfig; config sits above data, so the
# type is not imported here).
DataSection = Any
SourceFn = Callable[[DataSection, int], Splits]
SourceCheck = Callable[[DataSection], list[str]]  # problems, each naming its field ([] = none)


@dataclass(frozen=True)
class DataSource:
    """A registered source and what it needs from the config."""

    name: str
    fn: SourceFn
    generated: bool  # makes its problems from the seed: needs data.n_test > 0
    check: SourceCheck | None = None  # what is wrong with its settings, before any work
    # bumped when the same settings and seed make different problems (a generator changed):
    # part of the data cache key, so no run reads the old problems back
    version: int = 1


REGISTRY: Registry[DataSource] = Registry(
    kind="data source", field="data.source", decorator="@data_source", attr="data_source"
)
SOURCES = REGISTRY.entries


def data_source(
    name: str, *, generated: bool = False, check: SourceCheck | None = None, version: int = 1
) -> Callable[[SourceFn], SourceFn]:
    """Register ``fn`` as the data source ``name`` (a second function under a taken name fails);
    ``check(data)`` lists what is wrong with the source's settings, run when the config loads;
    ``version``: raise it when a change to the generator makes other problems from the same
    settings, so runs stop reading the cached ones."""

    def register(fn: SourceFn) -> SourceFn:
        REGISTRY.add(DataSource(name, fn, generated=generated, check=check, version=version))
        return fn

    return register


def resolve_source(name: str) -> DataSource:
    """The source ``name`` names: a registered name or a ``module:function`` path to a function
    decorated with :func:`data_source`. ValueError naming ``data.source`` otherwise."""
    return REGISTRY.resolve(name)


@data_source("synthetic", generated=True)
def synthetic(data: DataSection, seed: int) -> Splits:
    """Generated GSM8K-style word problems (``data.synthetic``)."""
    return Splits(*generate_splits(data.synthetic, data.n_train, data.n_test, seed))


@data_source("code_synthetic", generated=True)
def code_synthetic(data: DataSection, seed: int) -> Splits:
    """Generated function-writing problems with tests (``data.code_synthetic``)."""
    return Splits(*generate_code_splits(data.code_synthetic, data.n_train, data.n_test, seed))


@data_source(
    "reasoning_gym", generated=True, check=lambda data: reasoning_gym_problems(data.reasoning_gym)
)
def reasoning_gym(data: DataSection, seed: int) -> Splits:
    """reasoning-gym's procedural tasks (``data.reasoning_gym``), scored by their own verifiers;
    training questions that are also held out are dropped."""
    train, test, overlap = reasoning_gym_splits(data.reasoning_gym, data.n_train, data.n_test, seed)
    if overlap:
        logger.info("dropped %d generated training question(s) that are held out", overlap)
    return Splits(train, test, {"train_questions_in_test_removed": overlap})


@data_source("humaneval")
def humaneval(data: DataSection, seed: int) -> Splits:
    """HumanEval's problems (``data.humaneval``: the bundled 164 or a file in their format); a
    ``data.humaneval.train_ratio`` share trained on, the rest held out."""
    return Splits(*humaneval_splits(data.humaneval, data.n_train, data.n_test, seed))


@data_source("gsm8k")
def gsm8k(data: DataSection, seed: int) -> Splits:
    """GSM8K's train and test files (``data.gsm8k_path``: bundled, a hub name, a path or URL)."""
    train = load_gsm8k(data.gsm8k_path, "train", strict=data.strict, limit=data.n_train or None)
    test = load_gsm8k(data.gsm8k_path, "test", strict=data.strict, limit=data.n_test or None)
    return Splits(train, test)


@data_source("dataset")
def dataset(data: DataSection, seed: int) -> Splits:
    """Any tabular data through the column mapping; the eval set from ``data.test_path``,
    ``data.test_split`` or a ``data.test_ratio`` share of train (split with ``seed``), with the
    eval questions removed from train. A bad column raises ``ColumnError`` naming it."""
    columns = Columns(
        data.prompt_key, data.answer_key, data.system_key, data.id_key, tuple(data.metadata_keys)
    )

    def samples(path: str, split: str) -> list[dict]:
        rows, label = load_table(path, split)
        return to_samples(rows, columns, label, name=split)

    train = samples(data.path, data.train_split)
    if data.test_ratio > 0:
        train, test = split_by_ratio(train, data.test_ratio, seed)
    else:
        test = samples(data.test_path or data.path, data.test_split)
    train, overlap = remove_test_questions(train, test)
    if overlap:
        logger.warning("removed %d training question(s) that are also in the eval set", overlap)
    train, test = train[: data.n_train or None], test[: data.n_test or None]
    return Splits(train, test, {"train_questions_in_test_removed": overlap})
