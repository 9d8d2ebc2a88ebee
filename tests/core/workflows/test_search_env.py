"""The search-agent environment: a generated corpus and its multi-hop questions, BM25 tools,
long-tailed tool latency with a time limit, the config that sets it, and a few-step run."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.rewards.short_answer import exact_match, f1
from core.workflows.latency import LatencySpec, ToolClock, episode_seed
from core.workflows.search_agent import run_tool
from core.workflows.search_data import (
    SearchSpec,
    generate_search_questions,
    generate_search_splits,
)
from core.workflows.search_env import SNIPPET_CHARS, TOP_K, build_corpus, search_index

SEARCH_YAML = "experiments/agent_search.yaml"
ONE_HOP_YAML = "experiments/agent_search_1hop.yaml"  # one-document questions in worlds


@pytest.mark.unit
def test_corpus_and_questions_are_deterministic_per_seed() -> None:
    spec = SearchSpec(corpus_size=60)
    first, again = build_corpus(5, 60), build_corpus.__wrapped__(5, 60)  # a fresh build
    assert first.documents == again.documents and len(first.documents) == 60
    other = build_corpus(6, 60)
    assert {d.title for d in first.documents.values()}.isdisjoint(
        d.title for d in other.documents.values()
    )
    questions = generate_search_questions(50, spec, seed=5)
    assert questions == generate_search_questions(50, spec, seed=5)
    assert [q["question"] for q in questions] != [
        q["question"] for q in generate_search_questions(50, spec, seed=6)
    ]
    assert Counter(q["hops"] for q in questions).keys() == {2, 3, 4}
    train, test = generate_search_splits(spec, 200, 40, seed=5)
    assert len(test) == 40 and not {q["question"] for q in train} & {q["question"] for q in test}
    with pytest.raises(ValueError, match="corpus_size"):
        SearchSpec(corpus_size=3)
    with pytest.raises(ValueError, match="min_hops"):
        SearchSpec(min_hops=3, max_hops=2)


@pytest.mark.unit
def test_a_world_shuffles_the_names_within_each_kind_and_keeps_the_facts() -> None:
    base, world = build_corpus(5, 60), build_corpus(5, 60, 2)
    assert build_corpus(5, 60, 0).documents == base.documents
    assert world.documents == build_corpus.__wrapped__(5, 60, 2).documents  # deterministic
    by_id = {e.doc_id: e for e in world.entities.values()}
    moved = 0
    for entity in base.entities.values():
        there = by_id[entity.doc_id]  # the same entity, under another name of its kind
        assert there.kind == entity.kind and there.attributes == entity.attributes
        assert sorted(there.relations) == sorted(entity.relations)
        for relation, name in there.relations.items():  # relations follow the renaming
            assert by_id[base.entities[entity.relations[relation]].doc_id].name == name
        moved += there.name != entity.name
    assert moved > len(base.entities) // 2
    assert {e.name for e in world.entities.values()} == set(base.entities)
    with pytest.raises(ValueError, match="world"):
        build_corpus(5, 60, -1)


@pytest.mark.unit
def test_with_worlds_held_out_questions_are_asked_in_worlds_training_never_saw() -> None:
    spec = SearchSpec(corpus_size=60, worlds=3)
    train, test = generate_search_splits(spec, 120, 30, seed=5)
    assert {q["corpus_world"] for q in train} == {1, 2, 3}
    assert {q["corpus_world"] for q in test} == {4, 5, 6}
    assert not {(q["question"], q["answer"]) for q in train} & {
        (q["question"], q["answer"]) for q in test
    }
    for q in train + test:  # the answer is what that world's last document says
        last = build_corpus(5, 60, q["corpus_world"]).documents[q["doc_ids"][-1]]
        assert q["answer"] in last.text and f"[[{last.title}]]" not in q["question"]
    # without worlds every question is over the corpus as generated
    assert {q["corpus_world"] for q in generate_search_questions(20, SearchSpec(60), 5)} == {0}


@pytest.mark.unit
def test_every_answer_is_reachable_hop_by_hop() -> None:
    """Each question links its first document's entity, each document links the next one, and
    the last one states the answer; a solved episode searches each linked name as written."""
    spec = SearchSpec(corpus_size=100)
    corpus = build_corpus(2, 100)
    for q in generate_search_questions(300, spec, seed=2):
        docs = [corpus.documents[doc_id] for doc_id in q["doc_ids"]]
        assert len(docs) == q["hops"] and len({d.doc_id for d in docs}) == q["hops"]
        assert f"[[{docs[0].title}]]" in q["question"]
        for here, there in zip(docs, docs[1:], strict=False):
            assert f"[[{there.title}]]" in here.text
        calls = [m["tool_calls"][0]["function"] for m in q["sft_messages"] if m.get("tool_calls")]
        assert [c["arguments"]["query"] for c in calls if c["name"] == "search"] == [
            d.title for d in docs
        ]
        assert q["answer"] in docs[-1].text
        # the opening search already finds the first document
        assert search_index(2, 100).ranked(docs[0].title, 1) == [docs[0].doc_id]


@pytest.mark.unit
def test_one_document_questions_ask_the_named_entity_and_bridge_episodes_do_not_search() -> None:
    """min_hops=1 asks an attribute of the entity the question links: one search answers it. A
    bridge episode of such a question answers without a search: a value of the asked attribute
    that another entity has (a guess, always wrong)."""
    spec = SearchSpec(corpus_size=60, min_hops=1, max_hops=2, top_k=1, snippet_chars=0)
    assert SearchSpec(corpus_size=60, min_hops=1, max_hops=1).min_hops == 1
    with pytest.raises(ValueError, match="min_hops"):
        SearchSpec(min_hops=0, max_hops=1)
    corpus = build_corpus(5, 60)
    questions = generate_search_questions(200, spec, seed=5)
    assert Counter(q["hops"] for q in questions).keys() == {1, 2}
    for q in (q for q in questions if q["hops"] == 1):
        doc = corpus.documents[q["doc_ids"][0]]
        assert f"[[{doc.title}]]" in q["question"] and q["answer"] in doc.text
        searches = [m for m in q["sft_messages"] if m.get("tool_calls")]
        assert [s["tool_calls"][0]["function"]["arguments"]["query"] for s in searches] == [
            doc.title
        ]
        assert q["sft_messages"][-1]["content"] == f"Answer: {q['answer']}"
    bridged = generate_search_questions(
        100, SearchSpec(corpus_size=60, min_hops=1, max_hops=1, bridge_fraction=1.0), seed=5
    )
    for q in bridged:
        [message] = q["sft_messages"]
        assert message["role"] == "assistant" and "tool_calls" not in message
        kind = corpus.entities[corpus.documents[q["doc_ids"][0]].title].kind
        asked = "country" if q["question"].startswith("In which") else None
        values = {
            value
            for e in corpus.of_kind(kind)
            for name, value in e.attributes.items()
            if name == asked or (asked is None and name.endswith("year"))
        }
        assert message["content"].removeprefix("Answer: ") in values
    for seed in range(20):  # the smallest corpora, where a kind may share one value, still guess
        tiny = SearchSpec(corpus_size=8, min_hops=1, max_hops=1, bridge_fraction=1.0)
        for q in generate_search_questions(20, tiny, seed=seed):
            assert exact_match(q["sft_messages"][-1]["content"], q["answer"]) == 0.0
        assert exact_match(q["sft_messages"][-1]["content"], q["answer"]) == 0.0


@pytest.mark.unit
def test_search_ranks_the_named_entity_first_and_tools_answer_errors() -> None:
    index = search_index(1, 200)
    entities = list(index.corpus.entities.values())
    assert all(index.ranked(e.name, 1) == [e.doc_id] for e in entities)
    company = index.corpus.of_kind("company")[0]
    hits = index.search(f"who founded {company.name}?").splitlines()
    assert hits[0].startswith(f"[{company.doc_id}] {company.name}: ") and len(hits) == TOP_K
    assert index.open(company.doc_id).startswith(company.name)
    assert "founded in" in run_tool(index, "open", json.dumps({"doc_id": company.doc_id}))
    assert "no results" in index.search("zzz qqq")
    for name, arguments, error in [
        ("open", '{"doc_id": "x9999"}', "no document 'x9999'"),
        ("open", "{}", "needs a 'doc_id'"),
        ("open", '{"doc_id": 3}', "needs a 'doc_id'"),
        ("search", '{"query": ""}', "non-empty 'query'"),
        ("search", "not json", "not JSON"),
        ("search", "[1]", "must be an object"),
        ("browse", "{}", "unknown tool 'browse'"),
    ]:
        assert run_tool(index, name, arguments).startswith("error:"), name
        assert error in run_tool(index, name, arguments)


@pytest.mark.unit
def test_a_hit_shows_a_snippet_or_the_whole_document() -> None:
    snippets, passages = search_index(1, 200), search_index(1, 200, top_k=1, snippet_chars=0)
    doc = max(snippets.corpus.documents.values(), key=lambda d: len(d.text))
    assert len(doc.text) > SNIPPET_CHARS and not snippets.shows_all_of(doc.doc_id)
    assert snippets.hit(doc.doc_id) == f"[{doc.doc_id}] {doc.title}: {doc.text[:SNIPPET_CHARS]}..."
    assert passages.shows_all_of(doc.doc_id)
    assert passages.search(doc.title) == f"[{doc.doc_id}] {doc.title}: {doc.text}"  # one hit
    with pytest.raises(ValueError, match="top_k >= 1"):
        search_index(1, 200, top_k=0)


@pytest.mark.unit
def test_latency_draws_match_the_configured_median_and_p99() -> None:
    spec = LatencySpec(median_s=0.5, p99_s=5.0)
    rng = random.Random(0)
    draws = sorted(spec.draw(rng) for _ in range(20_000))
    median, p99 = draws[10_000], draws[19_800]
    assert median == pytest.approx(0.5, rel=0.03) and p99 == pytest.approx(5.0, rel=0.08)
    assert LatencySpec(0.5).draw(rng) == 0.5  # no tail: always the median
    same = [LatencySpec(0.5, 5.0).draw(random.Random(episode_seed({"seed": 7}))) for _ in "ab"]
    assert same[0] == same[1] != LatencySpec(0.5, 5.0).draw(random.Random(episode_seed({})))
    with pytest.raises(ValueError, match="median_s <= p99_s"):
        LatencySpec(0.5, 0.2)


@pytest.mark.unit
def test_calls_past_the_time_limit_return_a_timeout_error() -> None:
    calls: list[str] = []

    def tool() -> str:
        calls.append("ran")
        return "result"

    async def run(spec: LatencySpec, n: int) -> tuple[list[str], ToolClock, float]:
        clock = ToolClock(spec, seed=1)
        started = time.monotonic()
        results = [await clock.call("search", tool) for _ in range(n)]
        return results, clock, time.monotonic() - started

    slow, clock, seconds = asyncio.run(run(LatencySpec(0.2, timeout_s=0.05), 3))
    assert slow == ["error: search timed out after 0.05 s; try again"] * 3 and not calls
    assert clock.n_timeouts == 3 and 0.15 <= seconds < 0.5
    # a long tail across the limit: the calls drawn past it time out, the quick ones finish
    spec = LatencySpec(0.02, 0.5, timeout_s=0.1)
    rng = random.Random(1)  # the clock's own draws, in order
    draws = [spec.draw(rng) for _ in range(30)]
    results, clock, _ = asyncio.run(run(spec, 30))
    assert 0 < sum(d > 0.1 for d in draws) <= clock.n_timeouts <= sum(d >= 0.05 for d in draws) < 30
    assert all(r.startswith("error: search timed out") for d, r in zip(draws, results) if d > 0.1)
    assert all(r == "result" for d, r in zip(draws, results) if d < 0.05)


@pytest.mark.unit
def test_short_answer_rewards() -> None:
    assert exact_match("I searched.\nAnswer: The Lowenrho.", "Lowenrho") == 1.0
    assert exact_match("answer is 1967", "1967") == 1.0
    assert exact_match("Answer: 1968", "1967") == 0.0 and exact_match("", "1967") == 0.0
    assert f1("Answer: Tanpul Systems Labs", "Tanpul Systems") == pytest.approx(0.8)
    assert f1("Answer: nothing", "Tanpul Systems") == 0.0


@pytest.mark.unit
def test_bad_latency_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="tools.latency_p99_s must be >= 0"):
        load_config(SEARCH_YAML, ["tools.latency_p99_s=-1"])
    with pytest.raises(ConfigError, match="tools.latency_p99_s=0.2 needs"):
        load_config(SEARCH_YAML, ["tools.latency_p99_s=0.2"])
    with pytest.raises(ConfigError, match="tools.latency_p99_s=1.0 needs.*tools.latency_s=0.0"):
        load_config(SEARCH_YAML, ["tools.latency_s=0", "tools.latency_p99_s=1"])
    with pytest.raises(ConfigError, match="corpus_size"):
        load_config(SEARCH_YAML, ["data.search_synthetic.corpus_size=2"])
    config = load_config(SEARCH_YAML)
    assert (config.agent.max_turns, config.tools.latency_p99_s) == (10, 5.0)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("recipe", "mode"),
    [(SEARCH_YAML, "conversation"), (SEARCH_YAML, "per_turn"), (ONE_HOP_YAML, "conversation")],
)
def test_a_run_trains_the_search_agent(tool_chat_model, tmp_path, recipe: str, mode: str) -> None:
    """Copy drills and SFT on solved conversations, then two RL steps of the search agent:
    episodes run the tools and are trained (as whole conversations, or call by call)."""
    from core.runtime.job import run_experiment

    summary = run_experiment(load_config(recipe, [
        f"model.path={tool_chat_model}", f"cluster.fileroot={tmp_path}", "experiment.trial=t",
        "data.n_train=40", "data.n_test=4", "eval.n_problems=4", "eval.max_new_tokens=8",
        "data.search_synthetic.corpus_size=40", "sft.steps=2", "sft.batch_size=4",
        "sft.copy_drill_steps=2", "sft.copy_drill_batch_size=4", "sft.copy_drill_first_steps=1",
        "learner.total_steps=2",
        "rollout.batch_size=2", "algorithm.group_size=2", "sampling.max_new_tokens=8",
        "agent.max_turns=2", "tools.latency_s=0", "tools.latency_p99_s=0",
        "eval.every_n_steps=0", "checkpoint.every_n_steps=0", f"agent.trajectory_mode={mode}",
        "eval.n_train_problems=3",
    ]))  # fmt: skip
    assert summary["steps"] == 2 and summary["rollout"]["episodes_failed"] == 0
    run_dir = Path(summary["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    trained = [r for r in rows if "actor/loss_tokens" in r]
    assert len(trained) == 2
    drills = [r for r in rows if "sft/copy_drill_loss" in r]
    assert len(drills) == 2
    # the first-turn phase and the rest each ran a schedule of their own, from its warm-up
    assert drills[0]["sft/copy_drill_lr"] == drills[1]["sft/copy_drill_lr"] > 0
    assert (run_dir / "copy_drills_first").is_dir() and (run_dir / "copy_drills").is_dir()
    # the training questions are scored too, at the start and at the end, beside held-out ones
    probes = [r["eval/train_accuracy"] for r in rows if "eval/train_accuracy" in r]
    assert len(probes) == 2 and all(0 <= a <= 1 for a in probes)
    assert [e["train_n"] for e in summary["evals"]] == [3, 3]
    assert len([r for r in rows if "sft/loss" in r]) == 2
    assert all(
        r["actor/tokens"] > 4 * 100 and 0 < r["actor/loss_tokens"] <= 4 * 2 * 8 for r in trained
    )
    # 4 episodes a step: 4 rows, or one per call (1 or 2 calls each) per turn
    rows_trained = {r["actor/sequences"] for r in trained}
    assert rows_trained == {4} if mode == "conversation" else rows_trained <= set(range(4, 9))
