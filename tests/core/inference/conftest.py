"""Fixtures for the inference tests: one tiny model folder, reference models, helpers.

The model is a freshly initialised ~1M-parameter Qwen2 (untrained: its greedy output is
repetitive, which is fine for checking that engines agree with each other and with HF).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from core.inference.engine.hf_engine import HFEngine
from core.models import create_pretrained, load_model, load_tokenizer
from tests.core.inference.helpers import CORPUS, ServerThread


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core box, two OpenMP threads competing with other
    processes stall badly (rounds of seconds instead of milliseconds). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_pretrained(
        "tiny", CORPUS, tmp_path_factory.mktemp("tiny"), vocab_size=300, seed=0
    )


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="session")
def ref_model(model_dir: Path):
    """The initial weights, for teacher-forced checks (read-only)."""
    return load_model(model_dir)


@pytest.fixture(scope="session")
def new_state(ref_model) -> dict[str, torch.Tensor]:
    """Visibly different weights (version 1): the initial ones plus seeded noise."""
    gen = torch.Generator().manual_seed(123)
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in ref_model.state_dict().items()
    }


@pytest.fixture(scope="session")
def new_model(model_dir: Path, new_state):
    model = load_model(model_dir)
    model.load_state_dict(new_state)
    return model


@pytest.fixture(scope="session")
def new_model_dir(new_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The version-1 weights saved the way the learner saves them (tied lm_head omitted)."""
    folder = tmp_path_factory.mktemp("v1")
    new_model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    texts = [
        f"Question: Ada has {i} shells and finds {i + 3} more. How many?\nAnswer:"
        for i in range(32)
    ]
    return [tokenizer(t)["input_ids"] for t in texts]


@pytest.fixture
def engine(model_dir: Path, tokenizer) -> Iterator[HFEngine]:
    """A fresh engine on its own copy of the initial weights (eos from the tokenizer)."""
    with HFEngine(load_model(model_dir), tokenizer, max_batch_size=64, seed=0) as eng:
        yield eng


@pytest.fixture
def no_eos_engine(model_dir: Path) -> Iterator[HFEngine]:
    """An engine that never stops on eos, so sampled lengths are predictable."""
    with HFEngine(load_model(model_dir), None, max_batch_size=64, seed=0) as eng:
        yield eng


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    threads = ServerThread()
    yield threads
    threads.close()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """A plain HTTP client for raw requests to a test's server (SGLang-shaped bodies)."""
    with httpx.Client(timeout=60) as client:
        yield client
