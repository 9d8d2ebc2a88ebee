"""Helpers shared by the agent tests (imported as ``tests.core.workflows.helpers``)."""

from __future__ import annotations

from typing import Any


def trained_spans(tokenizer: Any, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded runs of consecutive trained tokens (``mask`` 1), in order."""
    spans, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    spans.append(tokenizer.decode(current))
    return spans
