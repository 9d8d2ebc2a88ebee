"""Copy drills (core/data/copy_drills.py): which tokens of a turn are copies of its context, and
a drill's renaming keeps every copy a copy while no name or number stays what it was."""

from __future__ import annotations

import random

import pytest

from core.config import ConfigError, load_config
from core.data.copy_drills import build_drills, copied_spans, rename, turns
from core.data.prompting import Prompter
from core.models.tokenizer import number_tokens
from core.runtime.sft import _example
from core.workflows.search_data import SearchSpec, generate_search_questions
from core.workflows.terminal_data import TerminalSpec, terminal_splits
from core.workflows.terminal_env import TerminalTask

pytestmark = pytest.mark.unit


def test_turns_are_the_trained_runs_with_the_request_and_the_window_before_each() -> None:
    ids = list(range(10))
    mask = [0, 0, 0, 1, 1, 0, 0, 0, 1, 0]
    # the second turn reads the request's end (1 2) and what came right before it (6 7)
    assert turns(ids, mask, window=2) == [([1, 2], [3, 4]), ([1, 2, 6, 7], [8])]
    assert turns(ids, mask, window=4) == [([0, 1, 2], [3, 4]), ([0, 1, 2, 4, 5, 6, 7], [8])]
    assert turns(ids, mask, window=100) == [([0, 1, 2], [3, 4]), ([0, 1, 2, 3, 4, 5, 6, 7], [8])]


def test_a_copy_is_the_longest_run_of_the_context_from_left_to_right() -> None:
    context = [1, 50, 51, 2, 70, 60]
    # 1 50 51 2 is the longest run of the context there; then 60 (61 is not in the context)
    assert copied_spans([1, 50, 51, 2, 60, 61], context) == [(0, 4), (4, 5)]
    assert copied_spans([80, 81], context) == []


def test_a_renamed_drill_copies_fresh_names_and_numbers_and_trains_on_the_copies() -> None:
    digits = list(range(10))
    names = list(range(100, 140))
    conversations = []
    rng = random.Random(0)
    for _ in range(30):
        name = rng.sample(names, 2)
        number = rng.sample(digits, 3)
        context = [200, *name, 201, *number, 202]  # 200-204: the format, in every turn
        turn = [203, 200, *name, 201, *number, 204]  # 203, 204: the turn's own format
        conversations.append(([9, *context, *turn], [0] * (1 + len(context)) + [1] * len(turn)))
    drills = build_drills(conversations, window=8, digits=digits)
    assert set(drills.pool) <= set(names) and drills.digits == tuple(digits)
    drill = drills.drills[0]
    assert drill.spans == ((1, 8),)  # the longest run: the format between copies goes with them
    draws = [rename(drill, drills.pool, drills.digits, random.Random(seed)) for seed in range(5)]
    for ids, mask in draws:
        n = len(drill.context)
        assert ids[n + 1 : n + 8] == ids[0:7]  # still a copy of its context, renamed alike
        assert mask == [0] * n + [0] + [1] * 7 + [0]  # the copies, not the turn's format
        assert (ids[n], ids[n + 1], ids[n + 4], ids[-1]) == (203, 200, 201, 204)  # scaffold stays
        assert set(ids[n + 2 : n + 4]).isdisjoint(drill.context)  # a name it did not hold
    assert len({tuple(ids) for ids, _ in draws}) == 5
    assert rename(drill, drills.pool, drills.digits, random.Random(3)) == draws[3]


def test_conversations_that_copy_nothing_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="sft.copy_drill_steps"):
        build_drills([([1, 2, 3, 4], [0, 0, 1, 1])], window=4)


def test_a_search_episodes_drill_is_its_first_call_copying_the_questions_entity(
    tool_chat_tokenizer,
) -> None:
    """On real solved episodes: a drill is the first call, which copies the question's entity
    (later calls copy from tool output, which a cut-off window cannot tell apart)."""
    tokenizer = tool_chat_tokenizer
    prompter = Prompter.from_config(load_config("experiments/agent_search.yaml"), tokenizer)
    rows = generate_search_questions(40, SearchSpec(corpus_size=60), seed=3)
    examples = [_example(prompter, row) for row in rows]
    drills = build_drills(
        [(e.input_ids, e.loss_mask) for e in examples],
        window=256,  # this tokenizer spells names letter by letter
        digits=number_tokens(tokenizer),
    )
    assert len(drills.drills) == len(rows)
    for row, drill in zip(rows, drills.drills, strict=True):
        copies = [tokenizer.decode(drill.turn[a:b]) for a, b in drill.spans]
        entity = row["sft_messages"][0]["tool_calls"][0]["function"]["arguments"]["query"]
        assert entity in copies and f"[[{entity}]]" in tokenizer.decode(drill.context)
    ids, mask = drills.sample(random.Random(0))
    text = tokenizer.decode(ids)
    assert text.count("[[") == 1 and "<|im_start|>assistant" in text  # the format is kept
    name = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert f"[[{name}]]" in text and f'"query": "{name}"' in text


def test_drilling_all_turns_adds_the_answer_copied_out_of_tool_output(
    tool_chat_tokenizer,
) -> None:
    """A terminal ``find`` episode answers with the path grep printed: 'first' drills only its
    command (the function's name, out of the question), 'all' its answer too."""
    tokenizer = tool_chat_tokenizer
    prompter = Prompter.from_config(load_config("experiments/terminal.yaml"), tokenizer)
    rows = terminal_splits(TerminalSpec(tasks=["find"], n_files=3), 60, 1, seed=3).train
    pairs = [(e.input_ids, e.loss_mask) for e in (_example(prompter, row) for row in rows)]
    first = build_drills(pairs, window=256, digits=number_tokens(tokenizer))
    every = build_drills(pairs, window=256, digits=number_tokens(tokenizer), which="all")
    assert len(first.drills) <= len(rows) < len(every.drills) <= 2 * len(rows)
    paths = {TerminalTask.from_json(row["answer"]).expected for row in rows}
    answers = [
        (drill, path)
        for drill in every.drills
        if (path := tokenizer.decode(drill.turn).split("<|im_end|>")[0].strip()) in paths
    ]
    assert len(answers) > len(rows) // 2
    for drill, path in answers:
        copied = "".join(tokenizer.decode(drill.turn[a:b]) for a, b in drill.spans)
        module = path.removeprefix("src/").removesuffix(".py")
        assert module in copied and path in tokenizer.decode(drill.context)  # out of grep's output
    with pytest.raises(ValueError, match="expected one of"):
        build_drills(pairs, window=256, which="last")


def test_first_share_sets_how_often_a_draw_is_a_first_turn(tool_chat_tokenizer) -> None:
    """A 2-hop search episode whose hits show whole documents has 3 turns: search, search,
    answer. Drawn as they come, about a third of the drills are first searches (an answer that
    copies only common tokens is no drill); first_share sets the share."""
    tokenizer = tool_chat_tokenizer
    prompter = Prompter.from_config(load_config("experiments/agent_search.yaml"), tokenizer)
    spec = SearchSpec(corpus_size=60, min_hops=2, max_hops=2, top_k=1, snippet_chars=0)
    rows = generate_search_questions(40, spec, seed=3)
    pairs = [(e.input_ids, e.loss_mask) for e in (_example(prompter, row) for row in rows)]
    digits = number_tokens(tokenizer)
    for share in (None, 0.5, 1.0):
        drills = build_drills(pairs, window=64, digits=digits, which="all", first_share=share)
        first = [d for d in drills.drills if d.first]
        assert len(first) == len(rows) and 2 * len(rows) < len(drills.drills) <= 3 * len(rows)
        expected = len(first) / len(drills.drills) if share is None else share
        assert all(len(d.context) == 64 for d in first)  # the request alone
        rng = random.Random(0)
        drawn = sum(drills.draw(rng).first for _ in range(3000)) / 3000
        assert drawn == pytest.approx(expected, abs=0.04), share
        # the first-turn phase of a drill schedule (sft.copy_drill_first_steps)
        assert all(drills.draw(rng, first_only=True).first for _ in range(300))
    with pytest.raises(ValueError, match="first_share"):
        build_drills(pairs, window=64, which="all", first_share=1.5)


def test_a_first_turn_phase_longer_than_the_drills_is_a_config_error() -> None:
    overrides = ["sft.copy_drill_steps=100", "sft.copy_drill_first_steps=101"]
    with pytest.raises(ConfigError, match=r"sft.copy_drill_first_steps \(101\)"):
        load_config("experiments/agent_search.yaml", overrides)
    config = load_config(
        "experiments/agent_search.yaml", [*overrides[:1], "sft.copy_drill_first_steps=100"]
    )
    assert config.sft.copy_drill_first_steps == 100
