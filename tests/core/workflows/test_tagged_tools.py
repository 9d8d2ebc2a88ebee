"""Tool-agent episodes: tool calls run, results are masked out, reward on the final answer.

The engine here replays scripted model turns (token ids of fixed text, logprob -0.5, its current
version) so the masks and the turn cutting can be checked token by token; the same workflow runs
on the real HF engine at the end of this file.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from core.data.templates import render_prompt
from core.inference.api import GenerationRequest, GenerationResponse, SamplingParams
from core.models.tokenizer import train_tokenizer
from core.sandbox import SandboxLimits
from core.workflows.tagged_tools import ToolAgentWorkflow
from core.workflows.tools import ToolBox

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [
        "Question: Finn has 7 beads. He gives away 2. Then 3 times as many.\nAnswer: 7-2=5. #### 15"
    ] * 20
    return train_tokenizer(corpus, vocab_size=300)


class ScriptedEngine:
    """Answers the i-th request with the i-th scripted text, honouring stop ids and the budget."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.requests: list[GenerationRequest] = []
        self.version = 3

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        self.requests.append(request)
        ids = self.tokenizer(self.turns.pop(0), add_special_tokens=False)["input_ids"]
        out, reason = [], "length"
        for token in ids[: request.sampling.max_new_tokens]:
            out.append(token)
            if token in request.sampling.stop_token_ids:
                reason = "stop"
                break
        return GenerationResponse(out, [-0.5] * len(out), [self.version] * len(out), reason)

    async def wait_until_resumed(self) -> None:
        return None


def workflow(tokenizer, latency: float = 0.0, max_turns: int = 4, max_new_tokens: int = 200):
    return ToolAgentWorkflow(
        tokenizer,
        "core.rewards.gsm8k:gsm8k_reward",
        SamplingParams(max_new_tokens),
        toolbox=ToolBox(SandboxLimits(wall_time_s=5), latency_s=latency),
        max_turns=max_turns,
    )


SAMPLE = {
    "id": "q1",
    "question": "Finn has 7 beads. He gives away 2. Then 3 times as many.",
    "answer": "#### 15",
}


def masked_text(tokenizer, traj, value: int) -> str:
    return tokenizer.decode(
        [
            t
            for t, m in zip(traj.input_ids[traj.prompt_len :], traj.loss_mask[traj.prompt_len :])
            if m == value
        ]
    )


def test_tool_call_result_masked_and_rewarded(tokenizer) -> None:
    # The first turn keeps "talking" after its call; those tokens must be cut off.
    engine = ScriptedEngine(
        tokenizer, ["7-2=<calc>7-2</calc> ignored words", "5*3=<calc>5*3</calc>", " #### 15"]
    )
    traj = asyncio.run(workflow(tokenizer).run_episode(engine, SAMPLE))
    assert traj.metadata["turns"] == 3
    assert traj.reward == 1.0
    assert masked_text(tokenizer, traj, 1) == "7-2=<calc>7-2</calc>5*3=<calc>5*3</calc> #### 15"
    assert masked_text(tokenizer, traj, 0) == "<result>5</result><result>15</result>"
    assert "ignored" not in traj.metadata["completion"]
    gen = [i for i, m in enumerate(traj.loss_mask) if m]
    assert all(traj.logprobs[i] == -0.5 and traj.versions[i] == 3 for i in gen)
    assert all(
        traj.versions[i] == -1 and traj.logprobs[i] == 0.0
        for i, m in enumerate(traj.loss_mask)
        if not m
    )
    # one conversation: every turn names the episode's session (HTTP clients keep it on one server)
    assert len({r.session for r in engine.requests}) == 1 and engine.requests[0].session
    # the second turn saw prompt + first turn + tool result as context
    second = engine.requests[1].input_ids
    assert tokenizer.decode(second).endswith("7-2=<calc>7-2</calc><result>5</result>")
    # closing tags are single tokens, so the engine was asked to stop on them
    close = tokenizer("</calc>", add_special_tokens=False)["input_ids"]
    assert len(close) == 1 and close[0] in engine.requests[0].sampling.stop_token_ids


def test_tool_result_numbers_do_not_count_as_the_answer(tokenizer) -> None:
    engine = ScriptedEngine(tokenizer, ["<calc>5*3</calc>", " I am not sure."])
    traj = asyncio.run(workflow(tokenizer).run_episode(engine, SAMPLE))
    assert "<result>15</result>" in traj.metadata["completion"]
    assert traj.reward == 0.0


def test_python_tool_and_errors(tokenizer) -> None:
    engine = ScriptedEngine(
        tokenizer, ["<python>print(5*3)</python>", "<calc>1/0</calc>", " #### 15"]
    )
    traj = asyncio.run(workflow(tokenizer).run_episode(engine, SAMPLE))
    assert (
        masked_text(tokenizer, traj, 0)
        == "<result>15</result><result>error: division by zero</result>"
    )
    assert traj.reward == 1.0


def test_max_turns_and_token_budget(tokenizer) -> None:
    engine = ScriptedEngine(tokenizer, ["<calc>1+1</calc>"] * 5)
    traj = asyncio.run(workflow(tokenizer, max_turns=2).run_episode(engine, SAMPLE))
    assert traj.metadata["turns"] == 2 and len(engine.requests) == 2

    engine = ScriptedEngine(tokenizer, ["<calc>1+1</calc>"] * 5)
    wf = workflow(tokenizer, max_new_tokens=8)
    traj = asyncio.run(wf.run_episode(engine, SAMPLE))
    assert traj.n_generated <= 8
    budgets = [r.sampling.max_new_tokens for r in engine.requests]
    assert budgets[0] == 8 and all(b2 < b1 for b1, b2 in zip(budgets, budgets[1:]))


def test_tool_latency_is_paid_per_call(tokenizer) -> None:
    engine = ScriptedEngine(tokenizer, ["<calc>1+1</calc>", "<calc>2+2</calc>", " #### 4"])
    start = time.monotonic()
    traj = asyncio.run(workflow(tokenizer, latency=0.2).run_episode(engine, SAMPLE))
    assert time.monotonic() - start >= 0.4
    assert traj.metadata["tool_seconds"] >= 0.4


@pytest.mark.integration
def test_agent_episode_on_the_real_engine(tmp_path) -> None:
    """A tiny random model on the HF engine: whatever it writes, masks and versions line up."""
    from core.inference.engine.hf_engine import HFEngine
    from core.models import create_pretrained, load_tokenizer

    corpus = ["Question: 7-2?\nAnswer: <calc>7-2</calc><result>5</result> #### 5"] * 30
    model_dir = create_pretrained("tiny", corpus, tmp_path / "m", vocab_size=300, seed=0)
    tok = load_tokenizer(model_dir)
    engine = HFEngine.from_pretrained(model_dir, seed=0)
    try:
        wf = ToolAgentWorkflow(
            tok,
            "core.rewards.gsm8k:gsm8k_reward",
            SamplingParams(24),
            toolbox=ToolBox(SandboxLimits(wall_time_s=5)),
            max_turns=3,
        )

        async def episodes():
            return await asyncio.gather(*(wf.run_episode(engine, SAMPLE) for _ in range(4)))

        for traj in asyncio.run(episodes()):
            gen = [i for i, m in enumerate(traj.loss_mask) if m]
            assert 0 < len(gen) <= 24 and traj.metadata["turns"] >= 1
            assert all(traj.versions[i] == 0 for i in gen)
            assert all(traj.versions[i] == -1 for i, m in enumerate(traj.loss_mask) if not m)
            assert (
                traj.input_ids[: traj.prompt_len]
                == tok(render_prompt(SAMPLE["question"], "plain"), add_special_tokens=False)[
                    "input_ids"
                ]
            )
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["strict", "best_effort"])
def test_from_config_passes_the_sandbox_policy(tokenizer, mode: str) -> None:
    from core.config import Config

    config = Config()
    config.tools.sandbox, config.tools.timeout_s = mode, 3.0
    wf = ToolAgentWorkflow.from_config(config, tokenizer)
    assert wf.toolbox.limits.isolation == mode and wf.toolbox.limits.wall_time_s == 3.0
