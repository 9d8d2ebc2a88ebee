"""A reward an untrained model already earns unevenly, so that a few RL steps have signal."""


def digit_share(completion: str, reference: str) -> float:
    """The share of digits among the completion's characters (the reference is ignored)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def has_digit(completion: str, reference: str) -> float:
    """1 when the completion holds a digit: a pass/fail reward a random model sometimes earns."""
    return float(any(c.isdigit() for c in completion))
