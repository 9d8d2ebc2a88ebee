"""GSM8K reward: find the final numeric answer in a completion and compare it to the reference.

Models write answers in many shapes (``#### 18``, ``\\boxed{18}``, ``The answer is $1,234.50.``),
so extraction tries the most explicit marker first and falls back to the last number in the
text. GSM8K solutions carry calculator annotations such as ``<<16-3-4=9>>``; they are removed
before anything else because they hold intermediate results, never the answer.
"""

import math
import re

from core.rewards.registry import with_completion_metrics

# Answers are parsed from text, not computed, so equal answers parse to equal floats; the
# tolerance only absorbs "18.0000000001"-style noise. A relative 1e-6 would be too loose:
# GSM8K has answers up to 192,000,000, and 1e-6 would accept 1,450,001 for 1,450,000.
REL_TOL = 1e-9
ABS_TOL = 1e-6

# One number as written. The minus must touch the digits and must not follow a word, digit or
# ")" so that "16-3" reads as a subtraction, not as -3. Thousands groups need exactly three
# digits so that a list like "1,2,3" stays three numbers. "(?<![\d.])" stops a match from
# starting in the middle of a number ("1.2.3" yields "1.2", not also ".3").
_NUMBER = re.compile(
    r"(?:(?<![\w)])(?P<sign>[-\u2212]))?"
    r"(?:\$\s?)?"
    r"(?<![\d.])(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:/(?P<den>\d+))?"
)
_ANNOTATION = re.compile(r"<<[^<>]*>>")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
# "####" counts only when a number follows, so a markdown heading ("#### Step 2") is no marker.
_MARKER = re.compile(r"####[ \t*]*")
_BOXED = re.compile(r"\\boxed\s*\{")
# "The answer is 18", "Final answer: 18", "**Answer:** 18", "answer = 18".
_PHRASE = re.compile(r"\banswer\b[*_ \t]*(?:is\b|:|=)[*_ \t:]*", re.IGNORECASE)


def _normalize(text: str) -> str:
    """Drop calculator annotations and turn LaTeX fractions into ``a/b``."""
    return _FRAC.sub(r"\1/\2", _ANNOTATION.sub("", text))


def _canonical(match: re.Match[str]) -> str:
    """Render a number match without "$" or commas: "-$1,234.50" -> "-1234.50"."""
    sign = "-" if match["sign"] else ""
    den = f"/{match['den']}" if match["den"] else ""
    return f"{sign}{match['num'].replace(',', '')}{den}"


def _last_number_after(pattern: re.Pattern[str], text: str) -> tuple[int, str] | None:
    """Start and value of the last ``pattern`` match that is directly followed by a number."""
    found = None
    for hit in pattern.finditer(text):
        number = _NUMBER.match(text, hit.end())
        if number is not None:
            found = (hit.start(), _canonical(number))
    return found


def _last_boxed_span(text: str) -> tuple[int, int] | None:
    """Content span of the last closed ``\\boxed{...}``, braces balanced (``\\boxed{\\text{18}}``).

    One pass with a stack keeps degenerate output (thousands of unclosed boxes) linear.
    """
    opens = {hit.end() - 1 for hit in _BOXED.finditer(text)}  # positions of each box's "{"
    if not opens:
        return None
    stack: list[int] = []
    best: tuple[int, int] | None = None  # ("{", "}") of the box that opens last
    for pos, char in enumerate(text):
        if char == "{":
            stack.append(pos)
        elif char == "}" and stack:
            opened = stack.pop()
            if opened in opens and (best is None or opened > best[0]):
                best = (opened, pos)
    return None if best is None else (best[0] + 1, best[1])


def _from_boxed(text: str) -> str | None:
    """The first number in the last ``\\boxed{}``; None when there is none or it holds no number."""
    span = _last_boxed_span(text)
    number = _NUMBER.search(text, *span) if span is not None else None
    return _canonical(number) if number is not None else None


def extract_answer(text: str) -> str | None:
    """Return the final answer a model wrote, as a plain number string, or None.

    Priority: the last ``#### X``; else the last ``\\boxed{X}``; else the last "The answer is X"
    / "answer: X"; else the last number in the text. The result has no "$" or commas and keeps
    sign, decimals and fractions as written ("-3", "1234.50", "3/4"); feed it to parse_number.
    """
    if not isinstance(text, str):
        return None
    text = _normalize(text)
    marker = _last_number_after(_MARKER, text)
    if marker is not None:
        return marker[1]
    boxed = _from_boxed(text)
    if boxed is not None:
        return boxed
    phrase = _last_number_after(_PHRASE, text)
    if phrase is not None:
        return phrase[1]
    numbers = list(_NUMBER.finditer(text))
    return _canonical(numbers[-1]) if numbers else None


def parse_number(s: str) -> float | None:
    """Parse the first number in ``s``: "$1,234.50" -> 1234.5, "3/4" -> 0.75, "18 dollars" -> 18.

    Returns None when there is no number, the denominator is zero, or the value overflows.
    Scientific notation is not supported ("1e3" parses as 1).
    """
    if not isinstance(s, str):
        return None
    match = _NUMBER.search(_normalize(s))
    if match is None:
        return None
    # float() rather than int(): a 500-digit "number" becomes inf instead of raising.
    value = float(match["num"].replace(",", ""))
    if match["den"]:
        den = float(match["den"])
        if den == 0:
            return None
        value /= den
    if match["sign"]:
        value = -value
    return value if math.isfinite(value) else None


def _reference_value(reference: str) -> float:
    """The target number of a reference: a full GSM8K answer field or a bare number."""
    answer = extract_answer(reference) if isinstance(reference, str) else None
    value = parse_number(answer) if answer is not None else None
    if value is None:
        raise ValueError(f"GSM8K reference has no parsable number: {str(reference)[-80:]!r}")
    return value


def gsm8k_reward(completion: str, reference: str) -> float:
    """1.0 when the completion's final answer equals the reference numerically, else 0.0.

    Never raises on the completion (anything unparsable scores 0.0); raises ValueError when the
    reference holds no number, since that is a data bug rather than a model mistake.
    """
    target = _reference_value(reference)
    answer = extract_answer(completion)
    value = parse_number(answer) if answer is not None else None
    if value is None:
        return 0.0
    return 1.0 if math.isclose(value, target, rel_tol=REL_TOL, abs_tol=ABS_TOL) else 0.0


def is_direct_answer(completion: str) -> bool:
    """True when the completion gives ``#### N`` with no worked step before it.

    A worked step is any "=" or ``<<...>>`` calculator annotation before the last marker. A
    completion with no ``#### N`` marker at all is not a direct answer.
    """
    if not isinstance(completion, str):
        return False
    marker = _last_number_after(_MARKER, completion)
    if marker is None:
        return False
    before = completion[: marker[0]]
    return "=" not in before and _ANNOTATION.search(before) is None


# What RL changes on the synthetic task: answer-only completions give way to worked ones.
with_completion_metrics(direct_share=is_direct_answer)(gsm8k_reward)
