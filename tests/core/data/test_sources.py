"""Data sources by name: the built-ins, one of the user's by import path through the whole
data stage, and the errors a wrong name gives before any work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.data.sources import SOURCES, Splits, data_source, resolve_source
from core.runtime.stages import data_cache_url, prepare_data

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"

USER_MODULE = """
from core.data.sources import Splits, data_source


@data_source("doubling", generated=True)
def doubling(data, seed):
    rows = [{"id": f"d{seed}-{i}", "question": f"What is 2 * {i}?", "answer": f"#### {2 * i}"}
            for i in range(data.n_train + data.n_test)]
    return Splits(rows[data.n_test:], rows[: data.n_test], {"made_by": "doubling"})


def undecorated(data, seed):
    return Splits([], [])


@data_source("even_only", generated=True,
             check=lambda data: [] if data.n_train % 2 == 0 else [f"data.n_train={data.n_train} must be even"])
def even_only(data, seed):
    return doubling(data, seed)
"""


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_sources.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_sources"
    sys.modules.pop("my_sources", None)
    SOURCES.pop("doubling", None)
    SOURCES.pop("even_only", None)


def test_the_built_ins_are_registered() -> None:
    generated = {name: source.generated for name, source in SOURCES.items()}
    assert generated == {
        "synthetic": True,
        "code_synthetic": True,
        "gsm8k": False,
        "dataset": False,
        "humaneval": False,
        "reasoning_gym": True,
        "search_synthetic": True,  # registered beside its environment, core/workflows
        "textarena": True,  # the same
        "verifiers": False,  # the same; an environment's own rows
        "customer_service": True,  # the same
        "terminal": True,  # the same
    }


def test_a_users_source_by_import_path_feeds_the_data_stage(
    user_module: str, tmp_path: Path
) -> None:
    overrides = [f"data.source={user_module}:doubling", "data.n_train=6", "data.n_test=2",
                 f"cluster.fileroot={tmp_path / 'runs'}", "data.seed=3"]  # fmt: skip
    data = prepare_data(load_config(QUICKSTART, overrides))
    assert [s["id"] for s in data.test] == ["d3-0", "d3-1"]
    assert len(data.train) == 6 and data.train[0]["answer"] == "#### 4"
    assert data.notes == {"made_by": "doubling"} and not data.cached
    assert prepare_data(load_config(QUICKSTART, overrides)).cached  # written once, read back


def test_a_new_generator_version_does_not_read_the_old_problems(
    user_module: str, tmp_path: Path
) -> None:
    overrides = [f"data.source={user_module}:doubling", "data.n_train=6", "data.n_test=2",
                 f"cluster.fileroot={tmp_path / 'runs'}", "data.seed=3"]  # fmt: skip
    cfg = load_config(QUICKSTART, overrides)
    assert not prepare_data(cfg).cached and prepare_data(cfg).cached
    data_source("doubling", generated=True, version=2)(
        SOURCES["doubling"].fn
    )  # the author bumps it
    assert data_cache_url(cfg).endswith("-3-v2")
    assert not prepare_data(cfg).cached  # made again by the new generator, then read back
    assert prepare_data(cfg).cached
    assert resolve_source("search_synthetic").version == 3  # its samples carry corpus_world


def test_a_generated_source_needs_held_out_problems(user_module: str) -> None:
    with pytest.raises(ConfigError, match="data.n_test must be > 0"):
        load_config(QUICKSTART, [f"data.source={user_module}:doubling", "data.n_test=0"])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("synthtic", r"data.source='synthtic' is not one of \['synthetic', 'code_synthetic'"),
        ("my_sources:undecorated", "is not decorated with @data_source"),
        ("my_sources:missing", "has no attribute 'missing'"),
    ],
)
def test_a_wrong_source_fails_at_load_naming_the_field(
    user_module: str, name: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(QUICKSTART, [f"data.source={name}"])


def test_a_sources_own_check_runs_when_the_config_loads(user_module: str) -> None:
    source = [f"data.source={user_module}:even_only", "data.n_test=2"]
    with pytest.raises(ConfigError, match="data.n_train=5 must be even"):
        load_config(QUICKSTART, [*source, "data.n_train=5"])
    assert load_config(QUICKSTART, [*source, "data.n_train=6"]).data.n_train == 6


def test_a_taken_name_cannot_be_registered_twice() -> None:
    def other(data, seed: int) -> Splits:
        return Splits([], [])

    with pytest.raises(ValueError, match="'gsm8k' is already core.data.sources:gsm8k"):
        data_source("gsm8k")(other)
    assert resolve_source("gsm8k").fn.__name__ == "gsm8k"
