"""``POST /v1/chat/completions`` through the real ``openai`` package against our server."""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from core.inference.chat import render
from tests.core.inference.helpers import ServerThread

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def server(tool_chat_model) -> Iterator[str]:
    thread = ServerThread()
    try:
        handle = thread.start(model_dir=tool_chat_model, api_key="sk-test", seed=0)
        yield handle.url
    finally:
        thread.close()


def test_the_openai_client_chats_with_tools(server, tool_chat_tokenizer) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="sk-test", max_retries=0)
    messages = [{"role": "user", "content": "Q: what is 2+3?"}]
    reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                           max_tokens=8, temperature=1.0, seed=5)  # fmt: skip
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    token_ids = choice.model_extra["token_ids"]
    assert 1 <= len(token_ids) <= 8
    assert (
        reply.usage.completion_tokens == len(token_ids) == len(choice.model_extra["token_logprobs"])
    )
    assert choice.model_extra["token_versions"] == [0] * len(token_ids)
    prompt = render(tool_chat_tokenizer, messages, TOOLS)
    assert reply.usage.prompt_tokens == len(
        tool_chat_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    )
    text = tool_chat_tokenizer.decode(token_ids, skip_special_tokens=True).strip()
    assert (choice.message.content or "") == text  # no tool call in an untrained model's reply
    # The same seed, the same reply; the conversation continues with a tool turn.
    again = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                           max_tokens=8, temperature=1.0, seed=5)  # fmt: skip
    assert again.choices[0].model_extra["token_ids"] == token_ids
    messages += [choice.message.model_dump(exclude_none=True), {"role": "tool", "content": "5"}]
    follow = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                            max_tokens=4)  # fmt: skip
    assert follow.usage.prompt_tokens > reply.usage.prompt_tokens + len(token_ids)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "seed": "7"}, "seed"),
        ({"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_requests_name_the_field(server, body, field) -> None:
    reply = httpx.post(f"{server}/v1/chat/completions", json=body,
                       headers={"Authorization": "Bearer sk-test"})  # fmt: skip
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"].startswith(f"{field}:")


def test_the_key_is_required(server) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])


def _post(server: str, body: dict | bytes) -> httpx.Response:
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json"}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server}/v1/chat/completions", content=raw, headers=headers, timeout=60)


def test_large_or_broken_bodies_are_refused_before_tokenising(server) -> None:
    """A 20 MB message used to take ~1 minute to be refused (and held every other request);
    50k messages got "max_tokens: 4 is out of range [0, -19998007]"; a lone surrogate a 500."""
    start = time.monotonic()
    huge = _post(server, {"messages": [{"role": "user", "content": "x" * 20_000_000}]})
    assert huge.status_code == 400 and time.monotonic() - start < 15
    assert huge.json()["error"]["message"].startswith("messages: over ")
    many = _post(server, {"messages": [{"role": "user", "content": "hi"}] * 50_000})
    assert many.status_code == 400
    assert many.json()["error"]["message"] == (
        "messages: 50000 messages; this server takes at most 4096"
    )
    surrogate = b'{"messages": [{"role": "user", "content": "caf\\ud800"}]}'
    broken = _post(server, surrogate)
    assert broken.status_code == 400, broken.text
    assert broken.json()["error"]["message"].startswith(
        "messages[0].content: is not valid Unicode (a lone surrogate at 3)"
    )


def test_a_conversation_longer_than_the_context_says_so(server, tool_chat_model) -> None:
    context = json.loads((tool_chat_model / "config.json").read_text())["max_position_embeddings"]
    words = " ".join(["Q: what is 2+3?"] * context)[: 16 * context]  # under the character limit
    reply = _post(server, {"messages": [{"role": "user", "content": words}], "max_tokens": 4})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith("messages: the rendered conversation is ")
    assert message.endswith(f"tokens; this model's context is {context}")


BYSTANDER_BOUND_S = 3.0  # an 8-token /generate call takes ~0.05 s here when the server is idle


def test_bystanders_stay_fast_while_oversized_bodies_are_refused(server) -> None:
    """Two 20 MB messages once held 8-token /generate calls for 42-80 s. Now they are refused
    before tokenising, a body over the 64 MiB cap gets a 413 naming it, and every bystander call
    made meanwhile answers within BYSTANDER_BOUND_S."""
    latencies: list[float] = []
    stop = threading.Event()
    headers = {"Authorization": "Bearer sk-test"}
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}}

    def bystander() -> None:
        with httpx.Client(headers=headers, timeout=120) as http:
            while not stop.is_set():
                t0 = time.monotonic()
                assert http.post(f"{server}/generate", json=body).status_code == 200
                latencies.append(time.monotonic() - t0)

    huge = json.dumps({"messages": [{"role": "user", "content": "x" * 20_000_000}]}).encode()
    over_cap = b'{"messages": [{"role": "user", "content": "' + b"y" * (65 * 1024**2) + b'"}]}'
    with cf.ThreadPoolExecutor(4) as pool:
        watcher = pool.submit(bystander)
        time.sleep(0.5)
        refused = [f.result() for f in [pool.submit(_post, server, huge) for _ in range(2)]]
        capped = pool.submit(_post, server, over_cap).result()
        time.sleep(0.5)
        stop.set()
        watcher.result()
    assert [r.status_code for r in refused] == [400, 400]
    assert capped.status_code == 413 and "67108864" in capped.text, capped.text[:300]
    assert len(latencies) >= 5 and max(latencies) < BYSTANDER_BOUND_S, sorted(latencies)[-5:]
    print(f"{len(latencies)} bystander calls, slowest {max(latencies):.2f} s")
