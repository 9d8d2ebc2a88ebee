"""Stop strings: generation ends after the token that completes one of them (the string stays
in the output, so the trained tokens are exactly the sampled ones).

Engines match on text, so they need a tokenizer: our engine checks the decoded tail of each
sequence after every token; SGLang and vLLM take the strings in their own ``stop`` field. A
workflow cuts its completion at the first stop string again (:func:`cut_at_stop`), so an
engine that cannot match strings (SGLang with ``--skip-tokenizer-init``) costs extra tokens,
never a wrong trajectory.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from core.inference.api import GenerationResponse

Decode = Callable[[Sequence[int]], str]
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def stop_string_problems(stops: Sequence[object], field: str) -> list[str]:
    """What is wrong with a list of stop strings (empty = nothing)."""
    if len(stops) > MAX_STOP_STRINGS:
        return [f"{field}: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}"]
    return [
        f"{field}[{i}]={s!r} must be a non-empty string of at most {MAX_STOP_CHARS} characters"
        for i, s in enumerate(stops)
        if not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_CHARS
    ]


def tail_matches(decode: Decode, output_ids: Sequence[int], stops: Sequence[str]) -> bool:
    """Whether the text of the last few tokens holds a stop string: called after every token, the
    first match is the one the newest token completed. The window (the longest string's length
    plus slack, in tokens) covers any string, since every token decodes to at least a byte."""
    window = max(len(s) for s in stops) + 4
    text = decode(output_ids[-window:])
    return any(s in text for s in stops)


def cut_at_stop(decode: Decode, output_ids: Sequence[int], stops: Sequence[str]) -> int | None:
    """The length of the shortest prefix of ``output_ids`` whose text holds a stop string, or
    None when the whole output holds none. Binary search: a prefix that holds a string keeps
    holding it as it grows."""
    if not stops or not output_ids or not any(s in decode(output_ids) for s in stops):
        return None
    lo, hi = 1, len(output_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(output_ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo


def cut_response(
    tokenizer: PreTrainedTokenizerBase, response: GenerationResponse, stops: Sequence[str]
) -> GenerationResponse:
    """``response`` ending at its first stop string (unchanged without one)."""
    decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
    n = cut_at_stop(decode, response.output_ids, stops)
    if n is None or (n == len(response.output_ids) and response.stop_reason == "stop"):
        return response
    return dataclasses.replace(
        response,
        output_ids=response.output_ids[:n],
        logprobs=response.logprobs[:n],
        versions=response.versions[:n],
        stop_reason="stop",
    )
