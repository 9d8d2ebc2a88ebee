"""Copy drills: teach a from-scratch model to copy a name or id out of its context.

An agent copies arguments all the time: the entity a question names into a search call, a doc
id out of a search result, an order number out of the customer's message. A pretrained LM can
already do that (induction heads, Olsson et al. 2022, arXiv 2209.11895); a from-scratch preset
cannot, and in a few hundred SFT steps on whole episodes it memorises the commonest name instead
of learning the copy, because a fixed corpus rewards memorising (docs/tutorials/own-agent.md).

A drill is an assistant turn of a training conversation and what it reads: the last ``window``
tokens of the user's request, and for a later turn the last ``window`` tokens before it too
(tool output). What the turn copies from there is renamed at random, the same way in both
places and nowhere else, so no memorised name can be right; the loss is on the copied tokens
only. Short, with fresh names at every draw, the copy forms in a few hundred steps where whole
episodes did not form it (measured in docs/tutorials/own-agent.md for the search agent and
docs/tutorials/environments.md for the terminal agent, where it formed in some seeds only).
"""

from __future__ import annotations

import functools
import random
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

COPY_DRILL_TURNS = ("first", "all")


@dataclass(frozen=True)
class Drill:
    """One assistant turn and what it reads: ``context`` ids, then ``turn`` ids, whose
    ``spans`` (half-open, in turn positions) are copies of runs of the context; ``renamed``: the
    copied names a draw renames (and its digits); ``where``: the positions of the copies and of
    what they copy in context + turn, the only ones a draw renames (the format stays)."""

    context: tuple[int, ...]
    turn: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    renamed: tuple[int, ...]
    where: tuple[int, ...]
    first: bool = True  # the conversation's first assistant turn (it copies from the request)


@dataclass(frozen=True)
class DrillSet:
    """The drills of a training set, and the tokens a renamed copy may be drawn from;
    ``first_share``: the share of draws that are first turns (None: as many as they are)."""

    drills: tuple[Drill, ...]
    pool: tuple[int, ...]
    digits: tuple[int, ...] = ()
    first_share: float | None = None

    @functools.cached_property
    def _groups(self) -> tuple[list[Drill], list[Drill]]:
        return [d for d in self.drills if d.first], [d for d in self.drills if not d.first]

    def draw(self, rng: random.Random, first_only: bool = False) -> Drill:
        """A random drill, a first turn with probability ``first_share`` where that is set (or
        always, with ``first_only``)."""
        first, later = self._groups
        share = 1.0 if first_only else self.first_share
        if share is None or not first or not later:
            return rng.choice(self.drills)
        return rng.choice(first if rng.random() < share else later)

    def sample(self, rng: random.Random, first_only: bool = False) -> tuple[list[int], list[int]]:
        """A random drill (see :meth:`draw`) with fresh names and numbers: ``(ids,
        loss_mask)``, the mask on its copies."""
        return rename(self.draw(rng, first_only), self.pool, self.digits, rng)


def turns(
    ids: Sequence[int], mask: Sequence[int], window: int
) -> list[tuple[list[int], list[int]]]:
    """Each trained run of ``mask`` (an assistant turn) with what it reads: ``[(context,
    turn), ...]``. The first turn reads the last ``window`` ids before it (the request); a later
    one reads the request too, then the last ``window`` ids before it: a window cut out of the
    middle of a long episode would lose the question that decides which name to copy."""
    out: list[tuple[list[int], list[int]]] = []
    start, request_end, request = None, 0, []
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            if not out:  # the first turn: what comes before it is the request
                request_end, request = start, list(ids[max(0, start - window) : start])
            recent = list(ids[max(request_end, start - window) : start])  # [] for the first
            out.append((request + recent, list(ids[start:i])))
            start = None
    return out


def copied_spans(turn: Sequence[int], context: Sequence[int]) -> list[tuple[int, int]]:
    """The longest runs of ``turn``, left to right, that also occur in ``context``."""
    where: dict[int, list[int]] = defaultdict(list)
    for j, token in enumerate(context):
        where[token].append(j)
    spans, i = [], 0
    while i < len(turn):
        best = 0
        for j in where.get(turn[i], ()):
            n = 1
            while i + n < len(turn) and j + n < len(context) and turn[i + n] == context[j + n]:
                n += 1
            best = max(best, n)
        if best:
            spans.append((i, i + best))
        i += max(best, 1)
    return spans


def build_drills(
    conversations: Sequence[tuple[Sequence[int], Sequence[int]]],
    window: int,
    *,
    digits: Collection[int] = (),
    format_share: float = 0.1,
    which: str = "first",
    first_share: float | None = None,
) -> DrillSet:
    """The drills of ``conversations`` (``(ids, loss_mask)`` as SFT trains on them): each
    one's first assistant turn, which copies from the user's request (``which="first"``), or
    every assistant turn (``"all"``), later ones copying from tool output too.

    A run found in at least ``format_share`` of the turns is the format's (``{"query": "``),
    not a copy; a token in that share is never renamed. ``digits`` (the tokenizer's number
    tokens) are shuffled among themselves, however common: a number is as arbitrary as a
    name. ``first_share`` (with ``"all"``): the share of draws that are first turns, which
    otherwise get one draw in as many as an episode has turns."""
    if which not in COPY_DRILL_TURNS:
        raise ValueError(f"unknown drilled turns {which!r}: expected one of {COPY_DRILL_TURNS}")
    if first_share is not None and not 0 <= first_share <= 1:
        raise ValueError(f"first_share must be in [0, 1], got {first_share}")
    excerpts, firsts = [], []
    for ids, mask in conversations:
        if any(mask):
            for k, excerpt in enumerate(
                turns(ids, mask, window)[: 1 if which == "first" else None]
            ):
                excerpts.append(excerpt)
                firsts.append(k == 0)
    if not excerpts:
        raise ValueError("copy drills need conversations with assistant turns")
    digit_set = frozenset(digits)
    limit = format_share * len(excerpts)
    runs = [copied_spans(turn, context) for context, turn in excerpts]
    run_counts = Counter(
        run
        for (_, turn), spans in zip(excerpts, runs, strict=True)
        for run in {tuple(turn[a:b]) for a, b in spans}
    )
    token_counts = Counter(token for _, turn in excerpts for token in set(turn))
    common = {t for t, n in token_counts.items() if n >= limit} - digit_set
    drills, pool = [], set()
    for (context, turn), candidates, first in zip(excerpts, runs, firsts, strict=True):
        spans = [(a, b) for a, b in candidates if run_counts[tuple(turn[a:b])] < limit]
        if spans:
            names = sorted({t for a, b in spans for t in turn[a:b]} - common - digit_set)
            where = _copy_positions(context, turn, spans)
            drills.append(
                Drill(tuple(context), tuple(turn), tuple(spans), tuple(names), where, first)
            )
            pool.update(names)
    if not drills:
        raise ValueError(
            f"no drilled assistant turn ({which}) copies anything from the context before it: "
            "copy drills have nothing to train (set sft.copy_drill_steps=0)"
        )
    return DrillSet(tuple(drills), tuple(sorted(pool)), tuple(sorted(digit_set)), first_share)


def _copy_positions(
    context: Sequence[int], turn: Sequence[int], spans: Sequence[tuple[int, int]]
) -> tuple[int, ...]:
    """Positions in context + turn of each copied run and of every occurrence of it in the
    context."""
    where: set[int] = set()
    for a, b in spans:
        run, n = list(turn[a:b]), b - a
        for i in range(len(context) - n + 1):
            if list(context[i : i + n]) == run:
                where.update(range(i, i + n))
        where.update(range(len(context) + a, len(context) + b))
    return tuple(sorted(where))


def rename(
    drill: Drill, pool: Sequence[int], digits: Sequence[int], rng: random.Random
) -> tuple[list[int], list[int]]:
    """``drill`` with its copied names mapped to random pool tokens it does not already hold
    and its digits shuffled among themselves, the same way at every copy and what it copies
    (nowhere else); loss mask on the copied positions."""
    ids = [*drill.context, *drill.turn]
    present = set(ids)
    free = [t for t in pool if t not in present]
    n = min(len(drill.renamed), len(free))
    mapping = dict(zip(drill.renamed[:n], rng.sample(free, n), strict=True))
    mapping |= dict(zip(digits, rng.sample(list(digits), len(digits)), strict=True))
    for k in drill.where:
        ids[k] = mapping.get(ids[k], ids[k])
    mask = [0] * len(ids)
    for a, b in drill.spans:
        for k in range(a, b):
            mask[len(drill.context) + k] = 1
    return ids, mask
