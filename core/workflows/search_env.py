"""A local, generated encyclopedia to search: made-up people, cities and companies, one short
document each, a BM25 index over them, and the two tools a search agent gets.

The corpus is a pure function of ``(seed, size)``: about half the entities are people, a quarter
cities, a quarter companies, all with invented names. Each has attributes (a birth year, a
country, a founding year) and relations (a city's mayor, a person's birthplace, a company's
founder and headquarters). Every fact is written in its subject's document; a relation is also
written in its object's (a person's document names the company they founded), so each hop of a
multi-hop question can be looked up by name. Questions over the corpus live in
:mod:`core.workflows.search_data`.

A *world* ``w > 0`` of a corpus (:func:`build_corpus`'s third argument) keeps its entities,
facts and relations and shuffles the names among the entities of each kind: the same names,
so the same tokens, but who is whose mayor and which year goes with which name change. Facts
learned in one world are wrong in another; only reading the documents carries over.

A document names the entities it relates to as wiki links (``[[Quikamo]]``, :func:`link`),
and so does a question the entity it starts from.

Tools (errors are results, never raises), offered to the model as :data:`TOOLS` and run by
:func:`run_tool` — the search agent at rollout time and the SFT episodes of
:mod:`core.workflows.search_data` both go through them, so the two cannot disagree::

    search(query) -> the top hits: "[doc_id] title: snippet", one a line
    open(doc_id)  -> the document's text

How much a hit shows is a knob (``snippet_chars``; 0 shows the whole document, as the passages
a Search-R1-style search tool returns), and so is the number of hits (``top_k``).

The BM25 index (``bm25s``; Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25
and Beyond", 2009) is built once per process per ``(seed, size)`` (:func:`search_index`).
"""

from __future__ import annotations

import copy
import functools
import random
from dataclasses import dataclass, field
from typing import Any

from core.inference.tool_calls import tool_arguments

_SYLLABLES = (
    "ka", "lo", "mir", "tan", "vel", "dra", "sen", "or", "bel", "qui", "zan", "rho", "fen",
    "gal", "nis", "tor", "ash", "wen", "pul", "dec", "ith", "mo", "sar", "ul", "vex", "ny",
)  # fmt: skip
_COMPANY_KINDS = ("Labs", "Works", "Holdings", "Industries", "Systems", "Foundry")
MIN_SIZE, MAX_SIZE = 8, 5000  # at least two cities, two companies, four people
# Kept short: every hit is context the model reads (and SFT episodes carry) on each search.
SNIPPET_CHARS = 48  # about the first clause: the rest takes open()
TOP_K = 2  # hits per search; names are unique, so the one searched for comes first


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


@dataclass
class Entity:
    """One person, city or company: its facts and the names of the entities it relates to."""

    kind: str  # "person" | "city" | "company"
    name: str
    doc_id: str
    attributes: dict[str, str] = field(default_factory=dict)
    relations: dict[str, str] = field(default_factory=dict)  # relation -> the other's name


@dataclass
class Corpus:
    """The generated world: entities by name, their documents by id."""

    seed: int
    size: int
    entities: dict[str, Entity]
    documents: dict[str, Document]
    world: int = 0  # 0: the corpus as generated; w > 0: its names shuffled within each kind

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]


def _name(rng: random.Random, taken: set[str], parts: tuple[int, ...]) -> str:
    """A fresh made-up name of len(parts) words, each of that many syllables (one more syllable
    after every 20 clashes, so large corpora never run out of names)."""
    for attempt in range(10_000):
        grow = attempt // 20
        words = [
            "".join(rng.choice(_SYLLABLES) for _ in range(n + grow)).capitalize() for n in parts
        ]
        name = " ".join(words)
        if name not in taken and not taken.intersection(words):
            taken.add(name)
            taken.update(words)  # each word names one entity: a query by name finds it
            return name
    raise AssertionError("no fresh name found")


def link(name: str) -> str:
    """How a document or a question names another entity: ``[[Name]]``, a wiki link. The
    brackets also make the name's first word tokenize as it does inside a tool call's JSON
    string (after a quote), so a query copies the name token for token."""
    return f"[[{name}]]"


def _documents(entities: dict[str, Entity]) -> dict[str, Document]:
    docs = {}
    for e in entities.values():
        a = e.attributes
        r = {relation: link(name) for relation, name in e.relations.items()}
        if e.kind == "person":
            text = f"{e.name} is a person born in {a['birth_year']} in {r['birthplace']}."
            if "founded" in r:
                text += f" {e.name} founded the company {r['founded']}."
            if "mayor_of" in r:
                text += f" {e.name} is the mayor of {r['mayor_of']}."
        elif e.kind == "city":
            text = (
                f"{e.name} is a city in {a['country']}, founded in {a['founded_year']}. "
                f"The mayor of {e.name} is {r['mayor']}."
            )
        else:
            text = (
                f"{e.name} is a company founded in {a['founded_year']} by {r['founder']}. "
                f"{e.name} is headquartered in {r['headquarters']}."
            )
        docs[e.doc_id] = Document(e.doc_id, e.name, text)
    return docs


def _check_size(size: int) -> None:
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"corpus size must be in [{MIN_SIZE}, {MAX_SIZE}], got {size}")


@functools.lru_cache(maxsize=1024)
def build_corpus(seed: int, size: int, world: int = 0) -> Corpus:
    """The corpus of ``size`` documents for ``seed``, or its ``world`` (see the module
    docstring); cached."""
    _check_size(size)
    if world < 0:
        raise ValueError(f"world must be >= 0, got {world}")
    if world:
        return _shuffled_names(build_corpus(seed, size), world)
    rng = random.Random(f"search-corpus-{seed}-{size}")
    n_cities = n_companies = size // 4
    n_people = size - n_cities - n_companies
    taken: set[str] = set()
    countries = [_name(rng, taken, (3,)) for _ in range(max(2, n_cities // 4))]
    entities: dict[str, Entity] = {}

    def add(kind: str, name: str, prefix: str, i: int) -> Entity:
        entities[name] = Entity(kind, name, f"{prefix}{i:04d}")
        return entities[name]

    cities = [
        add("city", _name(rng, taken, (rng.choice((2, 3)),)), "c", i) for i in range(n_cities)
    ]
    people = [
        add("person", _name(rng, taken, (rng.choice((2, 3)), 3)), "p", i) for i in range(n_people)
    ]
    companies = [
        add("company", f"{_name(rng, taken, (2,))} {rng.choice(_COMPANY_KINDS)}", "o", i)
        for i in range(n_companies)
    ]
    for city in cities:
        city.attributes = {"country": rng.choice(countries),
                           "founded_year": str(rng.randint(1100, 1890))}  # fmt: skip
    for person in people:
        person.attributes["birth_year"] = str(rng.randint(1900, 1995))
        person.relations["birthplace"] = rng.choice(cities).name
    for city, mayor in zip(cities, rng.sample(people, n_cities), strict=True):
        city.relations["mayor"], mayor.relations["mayor_of"] = mayor.name, city.name
    for company, founder in zip(companies, rng.sample(people, n_companies), strict=True):
        year = int(founder.attributes["birth_year"]) + rng.randint(22, 50)
        company.attributes["founded_year"] = str(year)
        company.relations["founder"], founder.relations["founded"] = founder.name, company.name
        company.relations["headquarters"] = rng.choice(cities).name
    return Corpus(seed, size, entities, _documents(entities))


def _shuffled_names(base: Corpus, world: int) -> Corpus:
    """``base`` with its names shuffled among the entities of each kind (a permutation drawn
    from the seed, size and ``world``); doc ids, facts and relations stay with the entities."""
    rng = random.Random(f"search-world-{base.seed}-{base.size}-{world}")
    rename: dict[str, str] = {}
    for kind in ("person", "city", "company"):  # a fixed order: the permutation is seeded
        names = [e.name for e in base.of_kind(kind)]
        rename.update(zip(names, rng.sample(names, len(names)), strict=True))
    entities = {
        rename[e.name]: Entity(
            e.kind,
            rename[e.name],
            e.doc_id,
            dict(e.attributes),
            {relation: rename[name] for relation, name in e.relations.items()},
        )
        for e in base.entities.values()
    }
    return Corpus(base.seed, base.size, entities, _documents(entities), world)


class SearchIndex:
    """BM25 over a corpus's documents (title and text), with the agent's two tools."""

    def __init__(
        self, corpus: Corpus, top_k: int = TOP_K, snippet_chars: int = SNIPPET_CHARS
    ) -> None:
        import bm25s  # only where a search agent runs

        self.corpus = corpus
        self._show(top_k, snippet_chars)
        self.doc_ids = list(corpus.documents)
        texts = [f"{d.title}. {d.text}" for d in corpus.documents.values()]
        self._bm25s = bm25s
        self.retriever = bm25s.BM25()
        self.retriever.index(self._tokenize(texts), show_progress=False)

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        return self._bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def ranked(self, query: str, k: int) -> list[str]:
        """Doc ids of the ``k`` best matches with a positive score, best first."""
        tokens = self._tokenize([query])
        if not tokens[0]:
            return []
        k = min(k, len(self.doc_ids))
        hits, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [self.doc_ids[h] for h, s in zip(hits[0], scores[0], strict=True) if s > 0]

    def search(self, query: object) -> str:
        """The ``search`` tool: top hits as ``[doc_id] title: snippet`` lines, or an error."""
        if not isinstance(query, str) or not query.strip():
            return "error: search needs a non-empty 'query' string"
        hits = self.ranked(query, self.top_k)
        if not hits:
            return f"no results for {query!r}"
        return "\n".join(self.hit(doc_id) for doc_id in hits)

    def hit(self, doc_id: str) -> str:
        """How a search result shows one document: ``[doc_id] title: snippet``."""
        doc = self.corpus.documents[doc_id]
        text = doc.text if self.shows_all_of(doc_id) else doc.text[: self.snippet_chars] + "..."
        return f"[{doc_id}] {doc.title}: {text}"

    def shows_all_of(self, doc_id: str) -> bool:
        """Whether a hit on ``doc_id`` shows its whole text (nothing left for ``open``)."""
        return (
            not self.snippet_chars or len(self.corpus.documents[doc_id].text) <= self.snippet_chars
        )

    def showing(self, top_k: int, snippet_chars: int) -> SearchIndex:
        """This index (its BM25 shared, not rebuilt) with hits shown another way."""
        view = copy.copy(self)
        view._show(top_k, snippet_chars)
        return view

    def _show(self, top_k: int, snippet_chars: int) -> None:
        if top_k < 1 or snippet_chars < 0:
            raise ValueError(
                f"need top_k >= 1 and snippet_chars >= 0, got {top_k}, {snippet_chars}"
            )
        self.top_k, self.snippet_chars = top_k, snippet_chars

    def open(self, doc_id: object) -> str:
        """The ``open`` tool: the document's title and text, or an error."""
        if not isinstance(doc_id, str) or not doc_id.strip():
            return "error: open needs a 'doc_id' string, e.g. from a search result"
        doc = self.corpus.documents.get(doc_id.strip().strip("[]"))
        if doc is None:
            return f"error: no document {doc_id!r}; search first and open an id it lists"
        return f"{doc.title}\n{doc.text}"


@functools.lru_cache(maxsize=1024)  # a world's index: ~5 ms to build, ~0.3 MB to keep
def search_index(
    seed: int, size: int, top_k: int = TOP_K, snippet_chars: int = SNIPPET_CHARS, world: int = 0
) -> SearchIndex:
    """The index over ``build_corpus(seed, size, world)``, built once per process; another way
    of showing hits shares its BM25."""
    if (top_k, snippet_chars) != (TOP_K, SNIPPET_CHARS):
        return search_index(seed, size, TOP_K, SNIPPET_CHARS, world).showing(top_k, snippet_chars)
    return SearchIndex(build_corpus(seed, size, world))


def sample_index(sample: dict[str, Any]) -> SearchIndex:
    """The index a search sample's agent searches: its corpus, as its question set shows hits."""
    return search_index(
        int(sample["corpus_seed"]),
        int(sample["corpus_size"]),
        int(sample.get("top_k", TOP_K)),
        int(sample.get("snippet_chars", SNIPPET_CHARS)),
        int(sample.get("corpus_world", 0)),
    )


def _tool(name: str, description: str, argument: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {argument: {"type": "string"}},
                "required": [argument],
            },
        },
    }


# What the model is offered, in the system turn of every prompt (rollout and SFT alike): kept
# short, since each prompt carries them.
SEARCH = _tool("search", "Find documents: [doc_id] title: snippet lines.", "query")
OPEN = _tool("open", "Read a document by doc_id.", "doc_id")
TOOLS = [SEARCH, OPEN]


def run_tool(index: SearchIndex, name: str, arguments: str | None) -> str:
    """One tool call's result text, from its name and JSON arguments (errors are results)."""
    parsed = tool_arguments(name, arguments)
    if isinstance(parsed, str):
        return parsed
    if name == "search":
        return index.search(parsed.get("query"))
    if name == "open":
        return index.open(parsed.get("doc_id"))
    return f"error: unknown tool {name!r}; the tools are search and open"
