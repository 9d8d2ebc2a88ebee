"""Solved search episodes for SFT (core.workflows.search_data): the tool turns are what the
agent's real tools return, the final answer scores 1.0, and SFT trains only the assistant turns
of a prompt that offers the agent's own tools."""

from __future__ import annotations

import json
import re

import pytest

from core.config import load_config
from core.data.prompting import Prompter
from core.inference.chat import render
from core.models.presets import MODEL_PRESETS
from core.rewards.registry import resolve_reward
from core.runtime.sft import _example
from core.workflows import search_agent
from core.workflows.search_data import SearchSpec, generate_search_questions
from core.workflows.search_env import TOOLS, run_tool, sample_index
from tests.core.workflows.helpers import trained_spans

pytestmark = pytest.mark.unit

SEARCH_YAML = "experiments/agent_search.yaml"
SPEC = SearchSpec(corpus_size=60)


PASSAGES = SearchSpec(corpus_size=60, top_k=1, snippet_chars=0)  # a hit shows the document
WORLDS = SearchSpec(corpus_size=60, top_k=1, snippet_chars=0, worlds=5)  # names shuffled


@pytest.mark.parametrize("spec", [SPEC, PASSAGES, WORLDS], ids=["snippets", "passages", "worlds"])
def test_episodes_replay_through_the_real_tools_and_score_one(spec: SearchSpec) -> None:
    config = load_config(SEARCH_YAML)
    reward = resolve_reward(config.rollout.reward_fn)
    rows = generate_search_questions(40, spec, seed=3)
    assert search_agent.TOOLS is TOOLS  # one definition: rollout offers what SFT shows
    for row in rows:
        index = sample_index(row)  # the one the agent searches
        assert (index.top_k, index.snippet_chars) == (spec.top_k, spec.snippet_chars)
        *turns, final = row["sft_messages"]
        # a hit that shows the whole document leaves nothing to open
        assert (
            row["tools"] == TOOLS and len(turns) == (4 if spec.snippet_chars else 2) * row["hops"]
        )
        opened, found = [], []
        for call_turn, tool_turn in zip(turns[::2], turns[1::2], strict=True):
            [call] = call_turn["tool_calls"]
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            assert call_turn["role"] == "assistant" and tool_turn["role"] == "tool"
            assert tool_turn["tool_call_id"] == call["id"]
            # the agent's tool runner, on the arguments as the model would write them
            assert tool_turn["content"] == run_tool(index, name, json.dumps(arguments))
            assert not tool_turn["content"].startswith(("error", "no results"))
            if name == "open":
                opened.append(arguments["doc_id"])
            else:
                found.append(tool_turn["content"].splitlines())
        assert opened == (row["doc_ids"] if spec.snippet_chars else [])
        assert [hits[0] for hits in found] == [index.hit(d) for d in row["doc_ids"]]
        assert all(len(hits) <= spec.top_k for hits in found)
        if not spec.snippet_chars:  # the answer is in the last hit, as the document has it
            assert row["answer"] in found[-1][0]
        assert final == {"role": "assistant", "content": f"Answer: {row['answer']}"}
        assert reward(final["content"], row["answer"]) == 1.0
        assert reward("Answer: 0", row["answer"]) == 0.0


def test_a_bridge_episode_stops_one_hop_short_and_answers_the_bridge_name() -> None:
    spec = SearchSpec(corpus_size=60, top_k=1, snippet_chars=0, bridge_fraction=0.7)
    reward = resolve_reward(load_config(SEARCH_YAML).rollout.reward_fn)
    rows = generate_search_questions(200, spec, seed=3)
    full = {r["id"]: r for r in generate_search_questions(200, PASSAGES, seed=3)}
    bridged = 0
    for row in rows:
        other = full[row["id"]]
        assert row["question"] == other["question"]  # the same questions, other episodes
        *turns, final = row["sft_messages"]
        if len(turns) == 2 * row["hops"]:
            assert row["sft_messages"] == other["sft_messages"]
            continue
        bridged += 1
        # every search but the last, then the name the last search would have taken
        assert turns == other["sft_messages"][: len(turns)] and len(turns) == 2 * row["hops"] - 2
        last = other["sft_messages"][-3]["tool_calls"][0]["function"]["arguments"]["query"]
        assert final["content"] == f"Answer: {last}" and f"[[{last}]]" in turns[-1]["content"]
        assert reward(final["content"], row["answer"]) == 0.0
    assert 0.6 < bridged / len(rows) < 0.8


def test_rows_are_deterministic_per_seed_and_only_train_has_episodes() -> None:
    rows = generate_search_questions(30, SPEC, seed=4)
    assert rows == generate_search_questions(30, SPEC, seed=4)
    assert "solution" not in rows[0]
    other = generate_search_questions(30, SPEC, seed=5)
    assert [r["sft_messages"] for r in rows] != [r["sft_messages"] for r in other]
    test = generate_search_questions(5, SPEC, seed=4, split="test")
    assert not any("sft_messages" in r or "tools" in r for r in test)


def test_sft_trains_the_tool_calls_and_the_answer_only(tool_chat_tokenizer) -> None:
    tokenizer = tool_chat_tokenizer
    config = load_config(SEARCH_YAML)
    prompter = Prompter.from_config(config, tokenizer)
    row = next(r for r in generate_search_questions(20, SPEC, seed=3) if r["hops"] == 3)
    example = _example(prompter, row)
    ids, mask = example.input_ids, example.loss_mask
    assert len(ids) < MODEL_PRESETS["tiny"].max_position_embeddings
    # the prompt is the one the agent client renders at rollout time, tools block included
    opening = prompter.opening(row["question"])
    prompt = tokenizer.decode(ids[: example.prompt_len])
    assert prompt == render(tokenizer, opening, search_agent.TOOLS)
    assert "<tools>" in prompt and config.data.system_prompt in prompt
    spans = trained_spans(tokenizer, ids, mask)
    assert len(spans) == 2 * row["hops"] + 1
    calls = [c for m in row["sft_messages"] if m["role"] == "assistant"
             for c in m.get("tool_calls", [])]  # fmt: skip
    for span, call in zip(spans, calls, strict=False):
        written = re.fullmatch(r"\n?<tool_call>\n(.*)\n</tool_call><\|im_end\|>", span, re.S)
        assert written is not None, span
        assert json.loads(written.group(1)) == {
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }
    assert spans[-1] == f"Answer: {row['answer']}<|im_end|>"
    untrained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    trained = "".join(spans)
    assert "<tool_response>" not in trained
    assert untrained.count("<tool_response>") == 2 * row["hops"]
    assert all(m["content"] in untrained for m in row["sft_messages"] if m["role"] == "tool")
