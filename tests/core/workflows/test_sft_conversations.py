"""SFT on solved agent conversations: the assistant turns trained, everything else masked, the
tokens laid out as the agent client lays them out at rollout time."""

from __future__ import annotations

import pytest

from core.data.prompting import Prompter
from core.data.synthetic import SyntheticSpec, generate_problems
from core.runtime.sft import _example
from tests.core.workflows.helpers import trained_spans

pytestmark = pytest.mark.unit


def test_assistant_turns_are_trained_and_the_rest_is_context(tool_chat_tokenizer) -> None:
    tokenizer = tool_chat_tokenizer
    prompter = Prompter(tokenizer, "chat", "plain", system_prompt="Solve it.")
    [row] = [r for r in generate_problems(20, SyntheticSpec(openai_tool_calls=True, min_steps=2), seed=1)
             if r["style"] == "worked"][:1]  # fmt: skip
    example = _example(prompter, row)
    ids, mask = example.input_ids, example.loss_mask
    # The sequence is the template's rendering of the whole conversation.
    messages = prompter.opening(row["question"]) + row["sft_messages"]
    rendered = tokenizer.apply_chat_template(messages, tools=row["tools"], tokenize=False)
    assert (
        rendered.startswith(tokenizer.decode(ids))
        and rendered[len(tokenizer.decode(ids)) :] == "\n"
    )
    # Trained spans: the two tool calls and the final answer, each closed by <|im_end|>.
    spans = trained_spans(tokenizer, ids, mask)
    assert len(spans) == 3 and all(span.endswith("<|im_end|>") for span in spans)
    assert '"name": "calc"' in spans[0] and "<tool_call>" in spans[0]
    assert spans[-1] == row["answer"] + "<|im_end|>"
    assert "<tool_response>" not in "".join(spans) and "Solve it." not in "".join(spans)
    assert example.prompt_len == mask.index(1)
    assert tokenizer.decode(ids[: example.prompt_len]).endswith("<|im_start|>assistant\n")


def test_direct_rows_and_plain_rows(tool_chat_tokenizer) -> None:
    prompter = Prompter(tool_chat_tokenizer, "chat", "plain")
    rows = generate_problems(20, SyntheticSpec(openai_tool_calls=True), seed=2)
    direct = next(r for r in rows if r["style"] == "direct")
    example = _example(prompter, direct)
    trained = tool_chat_tokenizer.decode(
        [t for t, m in zip(example.input_ids, example.loss_mask) if m]
    )
    assert trained == direct["answer"] + "<|im_end|>"
    plain = {k: v for k, v in direct.items() if k not in ("sft_messages", "tools")}
    assert "<tools>" not in tool_chat_tokenizer.decode(_example(prompter, plain).input_ids)
    assert "<tools>" in tool_chat_tokenizer.decode(example.input_ids)
    with pytest.raises(ValueError, match="data.prompt_format=chat"):
        _example(Prompter(tool_chat_tokenizer, "template", "plain"), direct)


def test_tool_answers_copy_the_last_result() -> None:
    """``tool_answer=result``: after its calc calls a solved conversation answers with the last
    tool result ("#### N"), so every number of the episode comes from the tool."""
    spec = SyntheticSpec(openai_tool_calls=True, min_steps=2, tool_answer="result")
    rows = generate_problems(20, spec, seed=1)
    worked = [r for r in rows if r["style"] == "worked"]
    assert worked and all(
        r["sft_messages"][-1]["content"] == f"#### {r['sft_messages'][-2]['content']}"
        == "#### " + r["answer"].split("####")[-1].strip()
        for r in worked
    )  # fmt: skip
    same = generate_problems(20, SyntheticSpec(openai_tool_calls=True, min_steps=2), seed=1)
    assert [r["question"] for r in same] == [r["question"] for r in rows]  # only the answers move
    with pytest.raises(ValueError, match="tool_answer='copy' is not one of"):
        SyntheticSpec(tool_answer="copy")
