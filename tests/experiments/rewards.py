"""A reward an untrained model already earns unevenly, so that a few RL steps have signal."""


def digit_share(completion: str, reference: str) -> float:
    """The share of digits among the completion's characters (the reference is ignored)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)
