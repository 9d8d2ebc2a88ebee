"""Agent code written against the OpenAI client shape: an episode scored and masked, the
calculator tool, and the config errors that stop a bad agent before any work (a real run of an
agent: tests/core/workflows/test_search_env.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from core.config import ConfigError, load_config
from core.data.prompting import Prompter
from core.inference.api import SamplingParams
from core.inference.engine.hf_engine import HFEngine
from core.models import load_model
from core.rewards.verifier_pool import make_scorer
from core.workflows.examples import run_calculator
from core.workflows.openai_agent import AgentEpisode, OpenAIAgentWorkflow

QUICKSTART = "experiments/quickstart.yaml"


@pytest.mark.unit
def test_calculator_tool_answers_calls_and_errors() -> None:
    assert run_calculator("calc", json.dumps({"expression": "3*(4+5)"})) == "27"
    assert run_calculator("calc", json.dumps({"expression": "1/0"})).startswith("error")
    assert "not JSON" in run_calculator("calc", "{oops")
    assert "unknown tool" in run_calculator("search", "{}")


@pytest.mark.unit
def test_an_episode_is_scored_and_masked(tool_chat_model, tool_chat_tokenizer) -> None:
    prompter = Prompter(tool_chat_tokenizer, "chat", "plain", system_prompt="Solve it.")
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)

    async def two_turns(episode: AgentEpisode) -> str:
        messages = list(episode.messages)
        first = await episode.client.chat.completions.create(messages=messages)
        messages += [first.choices[0].message, {"role": "user", "content": "Answer: 7"}]
        await episode.client.chat.completions.create(messages=messages)
        return "#### 7"  # the final answer the reward function scores

    workflow = OpenAIAgentWorkflow(tool_chat_tokenizer, two_turns, sampling,
                                   score=make_scorer("core.rewards.gsm8k:gsm8k_reward"), prompter=prompter)  # fmt: skip
    with HFEngine(load_model(tool_chat_model), tool_chat_tokenizer, seed=0) as engine:
        sample = {"question": "What is 3+4?", "answer": "#### 7", "seed": 11}
        (trajectory,) = asyncio.run(workflow.run_episode(engine, sample))
        (again,) = asyncio.run(workflow.run_episode(engine, sample))
        workflow.per_turn = True  # agent.trajectory_mode=per_turn
        first_call, second_call = asyncio.run(workflow.run_episode(engine, sample))
    assert trajectory.reward == 1.0 and trajectory.metadata["turns"] == 2
    assert trajectory.metadata["completion"] == "#### 7"
    assert trajectory.input_ids == again.input_ids  # the sample's seed fixes every call
    text = tool_chat_tokenizer.decode(trajectory.input_ids)
    assert "Solve it." in text and "Question: What is 3+4?" in text and "Answer: 7" in text
    n_prompt = trajectory.prompt_len
    assert not any(trajectory.loss_mask[:n_prompt]) and 2 <= sum(trajectory.loss_mask) <= 12
    # per turn: the same episode (same seed) as two rows that share its reward
    assert first_call.reward == second_call.reward == 1.0
    assert first_call.input_ids == trajectory.input_ids[: len(first_call.input_ids)]
    assert second_call.input_ids == trajectory.input_ids
    assert sum(first_call.loss_mask) + sum(second_call.loss_mask) == sum(trajectory.loss_mask)
    workflow.close()


@pytest.mark.unit
def test_bad_agents_are_config_errors() -> None:
    agent = ["rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow"]
    with pytest.raises(ConfigError, match="agent.function: needs an agent"):
        load_config(QUICKSTART, agent)
    with pytest.raises(ConfigError, match="agent.function"):
        load_config(QUICKSTART, [*agent, "agent.function=core.workflows.examples:nope"])
    with pytest.raises(ConfigError, match="must be an async function"):
        load_config(QUICKSTART, [*agent, "agent.function=core.inference.tool_calls:error_message"])
    calculator = [*agent, "agent.function=core.workflows.examples:calculator_agent"]
    with pytest.raises(ConfigError, match="agent.trajectory_mode='per_step' is not one of"):
        load_config(QUICKSTART, [*calculator, "agent.trajectory_mode=per_step"])
    with pytest.raises(ConfigError, match="per_turn needs the agent workflow"):
        load_config(QUICKSTART, ["agent.trajectory_mode=per_turn"])
    load_config(QUICKSTART, [*calculator, "agent.trajectory_mode=per_turn"])  # fine


@pytest.mark.integration
def test_the_calculator_recipe_runs_and_reports_tool_use(tmp_path) -> None:
    """experiments/agent_openai.yaml in a few steps: SFT on solved conversations, RL, evals; the
    tool-call share is logged per step and per eval, and the engine's log-probs of the trained
    tokens equal the learner's."""
    from core.runtime.job import run_experiment

    summary = run_experiment(load_config("experiments/agent_openai.yaml", [
        f"cluster.fileroot={tmp_path}", "experiment.trial=t", "data.n_train=64", "data.n_test=8",
        "eval.n_problems=8", "sft.steps=4", "learner.total_steps=2", "rollout.batch_size=2",
        "algorithm.group_size=2", "eval.every_n_steps=0", "checkpoint.every_n_steps=0",
    ]))  # fmt: skip
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (tmp_path / "agent-openai" / "t" / "metrics.jsonl").open()]
    steps = [r for r in rows if "actor/loss_tokens" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert len(steps) == 2 and len(evals) == 2
    assert all(0 <= r["agent/tool_call_share"] <= 1 for r in steps)
    assert all(0 <= r["eval/tool_call_share"] <= 1 for r in evals)
    assert steps[0]["mismatch/tokens"] > 0 and all(r["mismatch/abs_max"] < 1e-4 for r in steps)
