"""Fixtures for the training tests: one tiny Qwen2 model folder (built once) and its tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from core.models import create_pretrained, load_tokenizer
from tests.core.training.helpers import CORPUS


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Session scope: every module here (and the spawned ranks) reads the same folder.
    return create_pretrained(
        "tiny", CORPUS, tmp_path_factory.mktemp("tiny"), vocab_size=300, seed=0
    )


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core box, 2 OpenMP threads that lose their cores
    spin-wait and a tiny train step takes seconds instead of ~50 ms (measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
