"""Rewards that misbehave, by import path, for the verifier-pool tests."""

from __future__ import annotations

import time


def sleepy(completion: str, reference: str) -> float:
    """Hangs on a completion that says "hang"; otherwise exact match."""
    if "hang" in completion:
        time.sleep(60)
    return float(completion.strip() == reference.strip())


def broken(completion: str, reference: str) -> float:
    raise RuntimeError("verifier crashed")
