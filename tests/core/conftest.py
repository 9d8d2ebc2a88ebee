"""A tiny model with our chat format (turns, tools, tool calls: core.models.chat_template), for
the agent workflows' tests and the chat endpoint's."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.models import create_pretrained, load_tokenizer

CORPUS = [f"Q: what is {a}+{b}? A: {a + b}" for a in range(10) for b in range(10)]


@pytest.fixture(scope="session")
def tool_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tool-chat")
    return create_pretrained("tiny", CORPUS, folder, vocab_size=400, seed=1, chat=True)


@pytest.fixture(scope="session")
def tool_chat_tokenizer(tool_chat_model: Path):
    return load_tokenizer(tool_chat_model)
