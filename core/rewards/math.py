"""Math answers checked by symbolic equivalence (``math-verify``): LaTeX, ``\\boxed{}``, fractions.

``math_reward(completion, reference)`` is 1.0 when the answer the completion gives — its last
``\\boxed{...}``, else its last expression — equals the reference (``"\\frac{1}{2}"``, ``"0.5"``,
``"$x^2+1$"``, or a GSM8K ``"... #### 72"`` solution) as math, not as text.

math-verify bounds its own parsing time with ``signal.alarm``, which only the main thread of a
process may use: there it gets ``PARSE_TIMEOUT_S``; elsewhere it runs without and the caller
bounds it — run it in the verifier pool (``rollout.reward_workers``) for a hard wall-time limit.
"""

from __future__ import annotations

import threading

PARSE_TIMEOUT_S = 5


def _timeout() -> int | None:
    return PARSE_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def math_reward(completion: str, reference: str) -> float:
    """1.0 when ``completion``'s final answer equals ``reference`` mathematically, else 0.0."""
    from math_verify import parse, verify

    timeout = _timeout()
    reference = reference.rsplit("####", 1)[-1].strip()  # a GSM8K solution: its final number
    gold = parse(reference if "$" in reference or "\\" in reference else f"${reference}$",
                 parsing_timeout=timeout)  # fmt: skip
    if not gold:
        raise ValueError(f"reference {reference!r:.80} has no parsable answer")
    answer = parse(completion, parsing_timeout=timeout)
    return float(bool(answer) and verify(gold, answer, timeout_seconds=timeout))
