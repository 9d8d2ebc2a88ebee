"""The OpenAI-shaped client on a real engine: SDK types back, one trajectory per conversation (or
one per call) with exactly the tokens the model saw and sampled (teacher-forced log-probs
agree), context masked."""

from __future__ import annotations

import asyncio

import pytest
import torch
from openai.types.chat import ChatCompletion

from core.inference.api import SamplingParams, WeightSource
from core.inference.clients.sglang_client import SGLangClient
from core.inference.engine.hf_engine import HFEngine
from core.models import load_model
from core.workflows.openai_client import AgentChatClient
from tests.core.inference.helpers import ServerThread, wait_for_tokens

pytestmark = pytest.mark.unit

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
}}]  # fmt: skip


def converse(client: AgentChatClient) -> list[ChatCompletion]:
    async def main() -> list[ChatCompletion]:
        messages: list = [{"role": "system", "content": "Use tools."},
                          {"role": "user", "content": "Q: what is 3+4?"}]  # fmt: skip
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        messages += [
            first.choices[0].message,
            {"role": "tool", "tool_call_id": "c1", "content": "7"},
        ]
        second = await client.chat.completions.create(messages=messages, tools=TOOLS)
        messages += [second.choices[0].message.model_dump(), {"role": "user", "content": "sure?"}]
        third = await client.chat.completions.create(messages=messages, tools=TOOLS, max_tokens=3)
        return [first, second, third]

    return asyncio.run(main())


def test_a_conversation_is_one_trajectory_of_the_tokens_seen(
    tool_chat_model, tool_chat_tokenizer
) -> None:
    tokenizer = tool_chat_tokenizer
    model = load_model(tool_chat_model)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    with HFEngine(load_model(tool_chat_model), tokenizer, seed=0) as engine:
        client = AgentChatClient(engine, tokenizer, sampling, seed=7)
        replies = converse(client)
        (trajectory,) = client.trajectories(1.0)

    assert all(isinstance(r, ChatCompletion) for r in replies)
    assert replies[2].usage.completion_tokens <= 3
    ids, mask = trajectory.input_ids, trajectory.loss_mask
    # Each reply's tokens sit in the trajectory right after the prompt that call sent.
    for reply in replies:
        start = reply.usage.prompt_tokens
        tokens = reply.choices[0].token_ids
        assert ids[start : start + len(tokens)] == tokens
        assert all(mask[start : start + len(tokens)])
    assert sum(mask) == sum(r.usage.completion_tokens for r in replies)
    assert trajectory.prompt_len == replies[0].usage.prompt_tokens
    assert trajectory.metadata == {"turns": 3, "restarts": 0, "n_resumes": 0}
    # The context between replies is the template's rendering of the new messages.
    between = tokenizer.decode(ids[replies[0].usage.prompt_tokens + replies[0].usage.completion_tokens :
                                   replies[1].usage.prompt_tokens])  # fmt: skip
    assert "<tool_response>\n7\n</tool_response>" in between and between.endswith("assistant\n")
    # Teacher forcing the whole sequence gives the log-probs the engine sampled with.
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    on = torch.tensor(mask[1:]).bool()
    torch.testing.assert_close(torch.tensor(trajectory.logprobs[1:])[on], expected[on],
                               atol=1e-4, rtol=0)  # fmt: skip
    assert all(v == 0 for v, m in zip(trajectory.versions, mask, strict=True) if m)


def test_rewritten_history_restarts_the_trajectory(tool_chat_model, tool_chat_tokenizer) -> None:
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    with HFEngine(load_model(tool_chat_model), tool_chat_tokenizer, seed=0) as engine:
        client = AgentChatClient(engine, tool_chat_tokenizer, sampling)

        async def main():
            await client.chat.completions.create(messages=[{"role": "user", "content": "Q: 1+1?"}])
            return await client.chat.completions.create(
                messages=[{"role": "user", "content": "Q: 2+2?"}]  # not a continuation
            )

        second = asyncio.run(main())
    earlier, rewritten = client.trajectories(0.0)  # the first conversation is trained too
    assert rewritten.metadata["restarts"] == earlier.metadata["restarts"] == 1
    assert rewritten.prompt_len == second.usage.prompt_tokens
    assert len(rewritten.input_ids) == second.usage.total_tokens
    assert sum(earlier.loss_mask) + sum(rewritten.loss_mask) == client.completion_tokens
    assert earlier.reward == rewritten.reward == 0.0


def test_per_turn_trajectories_are_each_call_alone(tool_chat_model, tool_chat_tokenizer) -> None:
    """Per turn: one row per call, that call's prompt as context, its completion trained, the
    same tokens and log-probs the conversation row trains."""
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    with HFEngine(load_model(tool_chat_model), tool_chat_tokenizer, seed=0) as engine:
        client = AgentChatClient(engine, tool_chat_tokenizer, sampling, seed=7)
        replies = converse(client)
    rows = client.trajectories(0.5, True, note="x")  # per turn
    (conversation,) = client.trajectories(0.5)
    assert len(rows) == len(replies) == 3
    for row, reply in zip(rows, replies, strict=True):
        start, tokens = reply.usage.prompt_tokens, reply.choices[0].token_ids
        assert row.prompt_len == start and row.input_ids[start:] == tokens
        assert row.loss_mask == [0] * start + [1] * len(tokens)
        # this call's context is the conversation up to it, as the model saw it
        assert row.input_ids == conversation.input_ids[: start + len(tokens)]
        assert row.logprobs[start:] == conversation.logprobs[start : start + len(tokens)]
        assert row.reward == 0.5 and row.metadata == {
            "turns": 3, "restarts": 0, "n_resumes": 0, "note": "x"
        }  # fmt: skip


@pytest.mark.parametrize("mode", ["abort", "retract", "hold"])
def test_a_call_interrupted_by_a_weight_update_is_counted(
    tool_chat_model, tool_chat_tokenizer, mode: str
) -> None:
    """A weight update in the middle of a call, however the engine pauses for it (the call
    resubmitted after an abort, retracted and re-prefilled, or held in the batch): the episode
    records one interruption (the trainer's ``staleness/interrupted_frac``), and its tokens
    carry the version they were sampled with."""
    state = load_model(tool_chat_model).state_dict()
    # seed 0 runs this call to its 64-token limit (no end of turn), so the pause lands mid-call
    sampling = SamplingParams(max_new_tokens=64, temperature=1.0)
    with HFEngine(load_model(tool_chat_model), tool_chat_tokenizer, seed=0) as engine:
        client = AgentChatClient(engine, tool_chat_tokenizer, sampling, seed=0)

        async def main():
            messages = [{"role": "user", "content": "Q: what is 3+4?"}]
            call = asyncio.ensure_future(client.chat.completions.create(messages=messages))
            await wait_for_tokens(engine, 3)
            await engine.pause(mode)
            await engine.update_weights(WeightSource(state_dict=state), 1)
            await engine.resume()
            return await call

        reply = asyncio.run(main())
    (trajectory,) = client.trajectories(1.0)
    assert reply.usage.completion_tokens == 64 and trajectory.metadata["n_resumes"] == 1
    versions = [v for v, m in zip(trajectory.versions, trajectory.loss_mask, strict=True) if m]
    n_old = versions.count(0)
    assert 0 < n_old < 64 and versions == [0] * n_old + [1] * (64 - n_old)


def test_no_call_no_trajectory(tool_chat_tokenizer) -> None:
    client = AgentChatClient(None, tool_chat_tokenizer, SamplingParams(4))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no chat completion call"):
        client.trajectories(1.0)


def test_an_episode_stays_on_one_of_several_servers(tool_chat_model, tool_chat_tokenizer) -> None:
    """Over two servers, every call of one episode goes to the same server, so each later call
    continues the conversation in that server's prefix cache instead of prefilling it whole."""
    threads = ServerThread()
    try:
        a, b = (threads.start(model_dir=tool_chat_model, seed=0) for _ in range(2))

        async def episode() -> None:
            async with SGLangClient([a.address, b.address]) as engine:
                client = AgentChatClient(engine, tool_chat_tokenizer, SamplingParams(8), seed=7)
                await asyncio.to_thread(converse, client)  # converse runs its own event loop

        asyncio.run(episode())
        for handle in (a, b):
            asyncio.run(handle.engine.wait_idle())
        served = sorted((h.engine.stats.requests_served, h.engine.stats.prefix_cached_tokens)
                        for h in (a, b))  # fmt: skip
        assert served[0] == (0, 0) and served[1][0] == 3 and served[1][1] > 0
    finally:
        threads.close()


def test_per_call_sampling_the_learner_cannot_follow_is_refused(
    tool_chat_model, tool_chat_tokenizer
) -> None:
    """Issue 32 #5: a call's own temperature/top_p used to be sampled with while the learner
    rescored at sampling.temperature (behaviour log-probs of another distribution)."""
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, top_p=1.0)
    messages = [{"role": "user", "content": "Q: 1+1?"}]
    with HFEngine(load_model(tool_chat_model), tool_chat_tokenizer, seed=0) as engine:
        client = AgentChatClient(engine, tool_chat_tokenizer, sampling)
        create = client.chat.completions.create
        for kwargs, field in (
            ({"temperature": 0.7}, "sampling.temperature=1.0"),
            ({"top_p": 0.9}, "sampling.top_p=1.0"),
            ({"presence_penalty": 0.5}, "presence_penalty=0.5"),
            ({"n": 2}, "n=2"),
        ):
            with pytest.raises(ValueError, match=field):
                asyncio.run(create(messages=messages, **kwargs))
        # the run's own values (and neutral ones) are fine
        asyncio.run(create(messages=messages, temperature=1.0, top_p=1, n=1, seed=3))
    assert client.n_calls == 1
