"""Short-answer rewards: exact match and token F1 after SQuAD's normalisation.

Rajpurkar et al., "SQuAD: 100,000+ Questions for Machine Comprehension of Text" (2016), score a
short answer by exact match and by the F1 of its words against the reference's, both after
normalising case, punctuation, articles and whitespace (the official ``evaluate-v1.1.py``). The
answer in a completion (:func:`final_answer`) is what follows its last ``Answer:`` (or ``####``)
marker, up to the end of that line; a completion without a marker is taken whole.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_MARKER = re.compile(r"(?:\banswer\b\s*(?:is\b|:)|####)", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def final_answer(completion: str) -> str:
    """The text after the last answer marker, to the end of its line; else the whole text."""
    markers = list(_MARKER.finditer(completion))
    if not markers:
        return completion.strip()
    rest = completion[markers[-1].end() :].strip()
    return rest.splitlines()[0] if rest else ""


def exact_match(completion: str, reference: str) -> float:
    """1.0 when the completion's final answer equals ``reference`` after normalisation."""
    answer = normalize_answer(final_answer(completion))
    return float(bool(answer) and answer == normalize_answer(reference))


def f1(completion: str, reference: str) -> float:
    """Harmonic mean of word precision and recall of the final answer against ``reference``."""
    predicted = normalize_answer(final_answer(completion)).split()
    gold = normalize_answer(reference).split()
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)
