"""Bounds and choices declared on a config field, checked generically (core/schema.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from core.config import ConfigError, load_config
from core.schema import bound_problems, describe_bounds, documented
from tests.core.test_config import QUICKSTART

pytestmark = pytest.mark.unit


@dataclass
class Inner:
    share: float | None = documented(0.5, "A fraction.", ge=0, le=1)


@dataclass
class Outer:
    count: int = documented(1, "Positive.", gt=0)
    depth: int = documented(0, "Non-negative.", ge=0)
    mode: str = documented("a", "A or b.", choices=("a", "b"))
    free: int = documented(-7, "No bound.")
    inner: Inner = documented(help="Nested.", factory=Inner)


def test_values_inside_their_bounds_pass_and_none_is_allowed() -> None:
    assert list(bound_problems(Outer())) == []
    assert list(bound_problems(Outer(inner=Inner(share=None)))) == []
    assert list(bound_problems(Outer(inner=Inner(share=1.0), depth=0))) == []


def test_each_bound_names_the_dotted_key_and_the_value() -> None:
    bad = Outer(count=0, depth=-1, mode="c", inner=Inner(share=1.5))
    assert list(bound_problems(bad)) == [
        "count must be > 0, got 0",
        "depth must be >= 0, got -1",
        "mode='c' is not one of ['a', 'b']",
        "inner.share must be in [0, 1], got 1.5",
    ]


def test_descriptions() -> None:
    assert describe_bounds({"gt": 0, "le": 1}) == "in (0, 1]"
    assert describe_bounds({"le": 3}) == "<= 3"
    assert describe_bounds({}) == ""


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.max_staleness=-1", "rollout.max_staleness must be >= 0, got -1"),
        ("rollout.batch_size=0", "rollout.batch_size must be > 0, got 0"),
        ("learner.mismatch_warn_frac=2", r"learner.mismatch_warn_frac must be in \[0, 1\]"),
        (
            "inference.engine=tgi",
            r"inference.engine='tgi' is not one of \['hf', 'sglang', 'vllm'\]",
        ),
        ("data.prompt_format=xml", r"data.prompt_format='xml' is not one of \['template'"),
    ],
)
def test_the_run_config_checks_what_its_fields_declare(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(QUICKSTART, [override])
