"""Multi-hop questions over a generated corpus, for a search agent (``search_synthetic``).

Each question names one entity of the corpus (:mod:`core.workflows.search_env`) and follows 0-3
relations from it before asking an attribute, so answering takes 1-4 document lookups::

    "What is the founding year of the company founded by the mayor of [[Kasen]]?"
    Kasen's document -> its mayor -> the mayor's document -> their company -> its document

A sample is::

    {"id", "question", "answer": the exact answer ("1967", a country's name),
     "hops": documents to read, "doc_ids": those documents in order,
     "corpus_seed", "corpus_size", "corpus_world", "top_k", "snippet_chars": which corpus
     (and world of it) the agent searches and how its search shows hits}

TRAINING samples also carry a solved episode for SFT (:func:`solved_episode`): ``sft_messages``
(per hop a ``search`` call by the entity's name and, where the hit did not show the whole
document, an ``open`` of it, each followed by the tool's real output, then ``Answer: <answer>``,
the form ``exact_match`` scores; or, on ``bridge_fraction`` of them, one hop short and answering
the bridge entity's name, or on a one-document question a guess without a search) and
``tools`` (the agent's own :data:`~core.workflows.search_env.TOOLS`), so SFT prompts and tool
results are token for token what the agent sees at rollout time.

The corpus comes from ``data.seed`` (else the experiment seed) and ``corpus_size``; train and
test questions are drawn from separate streams over the same corpus, test questions never
repeating train ones. With ``worlds=N`` each training question is asked in one of N worlds of
the corpus (its names shuffled among the entities of a kind, :mod:`core.workflows.search_env`)
and each test question in one of N others, so no fact a policy memorises in training holds at
test time: a few hundred questions over one corpus are otherwise few enough to memorise.
"""

from __future__ import annotations

import copy
import functools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from core.data.sources import DataSection, Splits, data_source
from core.data.splits import SampleStream, first_samples, fresh_splits
from core.schema import documented
from core.workflows.search_env import (
    MAX_SIZE,
    MIN_SIZE,
    SNIPPET_CHARS,
    TOOLS,
    TOP_K,
    Corpus,
    Entity,
    SearchIndex,
    link,
    run_tool,
    search_index,
)

SPLITS: tuple[str, ...] = ("train", "test")

# relation -> (subject kind, object kind, noun phrase for the object given the subject's phrase)
RELATIONS: dict[str, tuple[str, str, str]] = {
    "mayor": ("city", "person", "the mayor of {x}"),
    "mayor_of": ("person", "city", "the city whose mayor is {x}"),
    "birthplace": ("person", "city", "the city where {x} was born"),
    "founded": ("person", "company", "the company founded by {x}"),
    "founder": ("company", "person", "the founder of {x}"),
    "headquarters": ("company", "city", "the city where {x} is headquartered"),
}
# kind -> (attribute, question given the entity's phrase)
ATTRIBUTES: dict[str, tuple[tuple[str, str], ...]] = {
    "person": (("birth_year", "What is the birth year of {x}?"),),
    "city": (
        ("founded_year", "What is the founding year of {x}?"),
        ("country", "In which country is {x}?"),
    ),
    "company": (("founded_year", "What is the founding year of {x}?"),),
}


@dataclass
class SearchSpec:
    """Knobs of the search question generator."""

    corpus_size: int = documented(
        200,
        f"Documents in the generated corpus ({MIN_SIZE}-{MAX_SIZE}): people, cities, companies.",
    )
    min_hops: int = documented(
        2,
        "Fewest documents a question needs read (1-4). 1 asks an attribute of the entity the "
        "question names (one search), the first stage of a curriculum.",
    )
    max_hops: int = documented(4, "Most documents a question needs read (1-4, >= min_hops).")
    top_k: int = documented(TOP_K, "Hits a search returns, best first.", gt=0)
    snippet_chars: int = documented(
        SNIPPET_CHARS,
        "Characters of a document's text a search hit shows (0: all of it, as the passages of a "
        "Search-R1-style search tool). A solved SFT episode opens a document only where its hit "
        "was cut short.",
        ge=0,
    )
    worlds: int = documented(
        0,
        "0: every question over the one corpus. N > 0: each training question is asked in one "
        "of N worlds of it (the same names shuffled among the entities of each kind, so the "
        "facts differ) and each test question in one of N others, never seen in training. On "
        "one 200-document corpus RL memorised the training questions (solved 5 -> 40 of 100) "
        "and barely moved held-out ones (3 -> 8).",
        ge=0,
    )
    bridge_fraction: float = documented(
        0.0,
        "Share of SFT episodes that stop one hop short and answer the bridge entity, the name "
        "the last document would be found by, instead of its attribute: always wrong, and the "
        "same copy as the search that would go on (a warm start RL can improve on). On a "
        "one-document question it answers unread: the asked attribute of another entity.",
        ge=0,
        le=1,
    )

    def __post_init__(self) -> None:
        if not MIN_SIZE <= self.corpus_size <= MAX_SIZE:
            raise ValueError(
                f"corpus_size must be in [{MIN_SIZE}, {MAX_SIZE}], got {self.corpus_size}"
            )
        if not 1 <= self.min_hops <= self.max_hops <= 4:
            raise ValueError(
                f"need 1 <= min_hops <= max_hops <= 4, got {self.min_hops}, {self.max_hops}"
            )


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    path: tuple[Entity, ...]  # the entities whose documents answer it, in order
    start: str  # the entity the question names
    attribute: str  # what it asks of the last entity ("founded_year", "country", ...)


def _walk(rng: random.Random, corpus: Corpus, n_relations: int) -> list[tuple[str, Entity]]:
    """A chain of ``n_relations`` relations from a random entity, never visiting one twice."""
    entities = list(corpus.entities.values())
    while True:
        current = rng.choice(entities)
        steps: list[tuple[str, Entity]] = [("", current)]
        while len(steps) <= n_relations:
            seen = {entity.name for _, entity in steps}
            options = sorted(r for r, name in current.relations.items() if name not in seen)
            if not options:
                break
            relation = rng.choice(options)
            current = corpus.entities[current.relations[relation]]
            steps.append((relation, current))
        if len(steps) == n_relations + 1:
            return steps


def sample_question(rng: random.Random, corpus: Corpus, hops: int) -> Question:
    """One question that takes ``hops`` documents to answer."""
    steps = _walk(rng, corpus, hops - 1)
    phrase = link(steps[0][1].name)
    for relation, _ in steps[1:]:
        phrase = RELATIONS[relation][2].format(x=phrase)
    last = steps[-1][1]
    attribute, template = rng.choice(ATTRIBUTES[last.kind])
    text = template.format(x=phrase)
    path = tuple(e for _, e in steps)
    return Question(text, last.attributes[attribute], path, steps[0][1].name, attribute)


def guess(question: Question, corpus: Corpus) -> str:
    """A wrong answer of the right type, the same for the same question: the asked attribute of
    another entity of the kind (what an agent that answers without reading would say), or
    ``unknown`` in a corpus so small that every entity of the kind shares the answer."""
    kind = question.path[-1].kind
    values = {e.attributes[question.attribute] for e in corpus.of_kind(kind)} - {question.answer}
    return random.Random(question.text).choice(sorted(values)) if values else "unknown"


def _call(k: int, name: str, arguments: dict[str, str]) -> dict:
    return {"id": f"call_{k}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


@functools.lru_cache(maxsize=65_536)
def _tool_result(index: SearchIndex, name: str, arguments: str) -> str:
    # The tools are pure functions of the corpus; a question set asks each name many times.
    return run_tool(index, name, arguments)


def solved_episode(question: Question, index: SearchIndex, bridge: bool = False) -> list[dict]:
    """The assistant and tool turns of a solved episode: for each document on the question's
    path, ``search`` its entity's name and, unless the hit showed the whole document, ``open``
    it, the tool turns being what :func:`~core.workflows.search_env.run_tool` returns; then
    ``Answer: <answer>``. With ``bridge`` it stops one document short and answers the last
    entity's name, which the document before names (a multi-hop reader's classic mistake); a
    one-document question has no document before, so it answers a :func:`guess` unread."""
    messages: list[dict] = []
    path = question.path[:-1] if bridge else question.path

    def call(name: str, arguments: dict[str, str]) -> str:
        tool_call = _call(len(messages) // 2, name, arguments)
        result = _tool_result(index, name, json.dumps(arguments))
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": result})
        return result

    for entity in path:
        found = call("search", {"query": entity.name})
        # names are unique words, so BM25 ranks the entity's own document first
        assert found.startswith(f"[{entity.doc_id}] "), entity.name
        if not index.shows_all_of(entity.doc_id):
            call("open", {"doc_id": entity.doc_id})
    if not bridge:
        answer = question.answer
    elif len(question.path) > 1:
        answer = question.path[-1].name
    else:
        answer = guess(question, index.corpus)
    return [*messages, {"role": "assistant", "content": f"Answer: {answer}"}]


def _to_sample(
    sample_id: str, question: Question, index: SearchIndex, split: str, bridge_fraction: float
) -> dict:
    corpus = index.corpus
    sample = {
        "id": sample_id,
        "question": question.text,
        "answer": question.answer,
        "hops": len(question.path),
        "doc_ids": [e.doc_id for e in question.path],
        "corpus_seed": corpus.seed,
        "corpus_size": corpus.size,
        "corpus_world": corpus.world,
        "top_k": index.top_k,
        "snippet_chars": index.snippet_chars,
    }
    if split == "train":
        bridge = bridge_fraction > 0 and random.Random(sample_id).random() < bridge_fraction
        sample["sft_messages"] = solved_episode(question, index, bridge)
        sample["tools"] = copy.deepcopy(TOOLS)
    return sample


def _stream(spec: SearchSpec, seed: int) -> SampleStream:
    def samples(split: str) -> Iterator[tuple[int, dict]]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        rng = random.Random(f"search-{seed}-{split}-questions")
        first_world = 1 if split == "train" else 1 + spec.worlds  # test: worlds train never saw
        i = 0
        while True:
            world = first_world + rng.randrange(spec.worlds) if spec.worlds else 0
            index = search_index(seed, spec.corpus_size, spec.top_k, spec.snippet_chars, world)
            hops = rng.randint(spec.min_hops, spec.max_hops)
            question = sample_question(rng, index.corpus, hops)
            sample_id = f"search-{split}-{seed}-{i}"
            yield i, _to_sample(sample_id, question, index, split, spec.bridge_fraction)
            i += 1

    return samples


def generate_search_questions(
    n: int, spec: SearchSpec, seed: int, split: str = "train"
) -> list[dict]:
    """The first ``n`` samples of ``split`` (see the module docstring); deterministic per seed."""
    return first_samples(_stream(spec, seed), n, split)


@data_source("search_synthetic", generated=True, version=3)  # 3: worlds (corpus_world)
def search_synthetic(data: DataSection, seed: int) -> Splits:
    """Multi-hop questions over the generated corpus (``data.search_synthetic``)."""
    return Splits(*generate_search_splits(data.search_synthetic, data.n_train, data.n_test, seed))


def generate_search_splits(
    spec: SearchSpec, n_train: int, n_test: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """Train and test sets with no test (question, answer) in train (nor twice in test): with
    worlds, a question's text may come again with another answer."""
    widen = "raise data.search_synthetic.corpus_size or lower data.n_train"
    return fresh_splits(_stream(spec, seed), n_train, n_test, widen, key=_question_and_answer)


def _question_and_answer(row: dict) -> tuple[str, str]:
    return row["question"], row["answer"]
