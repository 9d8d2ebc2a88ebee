"""Held-out evaluation: pass@k's estimator, and sampled answers that are repeatable."""

from __future__ import annotations

import asyncio
import logging
import time
from math import comb
from pathlib import Path

import pytest

from core.config import load_config
from core.evaluation import evaluate_workflow, pass_at_k
from core.inference.api import SamplingParams
from core.rollout.api import Trajectory
from core.runtime.stages import build_or_load_model, evaluate_model, prepare_data

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"


@pytest.mark.unit
def test_pass_at_k_is_the_unbiased_estimator() -> None:
    for n in (1, 4, 10):
        for correct in range(n + 1):
            for k in range(1, n + 1):
                expected = 1 - comb(n - correct, k) / comb(n, k)
                assert pass_at_k(n, correct, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate
    for bad in ((4, 1, 0), (4, 1, 5), (4, 5, 1)):
        with pytest.raises(ValueError, match="pass@k"):
            pass_at_k(*bad)


@pytest.mark.e2e
def test_sampled_eval_reports_pass_and_mean_at_k(tmp_path: Path) -> None:
    cfg = load_config(
        QUICKSTART,
        [
            f"cluster.fileroot={tmp_path}",
            "experiment.trial=e",
            "data.n_train=100",
            "data.n_test=16",
            "eval.n_problems=16",
            "eval.max_new_tokens=6",
            "eval.n_samples=4",
            "sft.enabled=false",
            "learner.total_steps=0",
            "rollout.reward_fn=tests.experiments.rewards:has_digit",
        ],
    )
    data = prepare_data(cfg)
    model_dir = build_or_load_model(cfg, data)
    first, second = (evaluate_model(cfg, model_dir, data.test) for _ in range(2))
    sampled = first.sampled
    assert set(sampled) == {"pass_at_1", "pass_at_4", "mean_at_4"}
    assert sampled["pass_at_1"] == pytest.approx(sampled["mean_at_4"])  # pass/fail rewards
    assert 0 < sampled["pass_at_1"] < sampled["pass_at_4"] <= 1
    assert second.sampled == sampled  # each answer is seeded: the eval repeats exactly
    assert second.accuracy == first.accuracy


@pytest.mark.unit
def test_sampling_needs_a_temperature() -> None:
    from core.config import ConfigError

    with pytest.raises(ConfigError, match="eval.temperature must be > 0"):
        load_config(QUICKSTART, ["eval.n_samples=4", "eval.temperature=0"])
    with pytest.raises(ConfigError, match="eval.n_samples must be >= 0"):
        load_config(QUICKSTART, ["eval.n_samples=-1"])


class _HangsOnSome:
    """A workflow whose episode never returns on every fourth question (a tool that hangs)."""

    sampling = SamplingParams(max_new_tokens=4)

    async def run_episode(self, engine, sample: dict) -> Trajectory:
        if int(sample["question"]) % 4 == 0:
            await asyncio.Event().wait()  # never set
        reward = 1.0 if sample["answer"] == "yes" else 0.0
        return Trajectory(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.1],
                          versions=[-1, 0], reward=reward, prompt_len=1)  # fmt: skip


def test_an_episode_that_never_returns_is_cut_off_and_counted(caplog) -> None:
    """It used to hang the run's first evaluation with no message (issue 36)."""
    samples = [{"question": str(i), "answer": "yes"} for i in range(8)]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="core.evaluation"):
        result = asyncio.run(evaluate_workflow(
            None, _HangsOnSome(), samples, max_new_tokens=4, max_concurrent=8, n_samples=2,
            episode_timeout_s=0.5,
        ))  # fmt: skip
    assert time.monotonic() - started < 10
    assert result.timed_out == 2 + 2 * 2  # questions 0 and 4: greedy, and each of 2 samples
    assert result.accuracy == pytest.approx(6 / 8)  # a timed-out episode scores 0
    assert result.sampled["mean_at_2"] == pytest.approx(6 / 8)
    assert "6 episode(s) ran past eval.episode_timeout_s=0.5" in caplog.text


class _RightOnEven:
    """A workflow that answers even-numbered questions right, odd ones wrong."""

    sampling = SamplingParams(max_new_tokens=4)

    async def run_episode(self, engine, sample: dict) -> Trajectory:
        reward = 1.0 if int(sample["question"]) % 2 == 0 else 0.0
        return Trajectory(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.1],
                          versions=[-1, 0], reward=reward, prompt_len=1)  # fmt: skip


@pytest.mark.unit
def test_a_mix_of_tasks_reports_accuracy_per_task() -> None:
    # questions 0-5 are "add" (3 of 6 right), 6-7 "legs" (1 of 2 right); 8-9 name no task
    tasks = ["add"] * 6 + ["legs"] * 2
    samples = [{"question": str(i), "answer": "", "task": t} for i, t in enumerate(tasks)]
    samples += [{"question": str(i), "answer": ""} for i in (8, 9)]
    result = asyncio.run(evaluate_workflow(None, _RightOnEven(), samples, max_new_tokens=4,
                                           max_concurrent=4))  # fmt: skip
    assert result.accuracy == pytest.approx(5 / 10)
    assert result.metrics == {"accuracy/add": pytest.approx(3 / 6), "accuracy/legs": 0.5}
    untagged = asyncio.run(evaluate_workflow(None, _RightOnEven(), samples[8:], max_new_tokens=4,
                                             max_concurrent=4))  # fmt: skip
    assert untagged.metrics == {}


class _Agent:
    """An agent-like workflow: reports ``metric/looked`` on questions 0-2, scores itself on
    even questions (``scored_by``) and leaves odd ones to the reward function."""

    sampling = SamplingParams(max_new_tokens=4)

    async def run_episode(self, engine, sample: dict) -> Trajectory:
        i = int(sample["question"])
        metadata = {
            "completion": f"answer {i}",
            **({"metric/looked": float(i == 0)} if i < 3 else {}),
        }
        if i % 2 == 0:
            metadata["scored_by"] = "agent"
        return Trajectory(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.1],
                          versions=[-1, 0], reward=1.0, prompt_len=1, metadata=metadata)  # fmt: skip


@pytest.mark.unit
def test_episode_metrics_are_averaged_and_reward_metrics_read_only_what_the_reward_scored() -> None:
    samples = [{"question": str(i), "answer": ""} for i in range(6)]
    seen: list[str] = []

    def length(text: str) -> float:
        seen.append(text)
        return float(len(text))

    result = asyncio.run(evaluate_workflow(None, _Agent(), samples, max_new_tokens=4,
                                           max_concurrent=2, metrics={"length": length}))  # fmt: skip
    # metric/looked over the three episodes that report it; the completion metric over the
    # three odd ones, which the reward function scored
    assert result.metrics == {"looked": pytest.approx(1 / 3), "length": 8.0}
    assert sorted(seen) == ["answer 1", "answer 3", "answer 5"]
    evens = asyncio.run(evaluate_workflow(None, _Agent(), samples[::2], max_new_tokens=4,
                                          max_concurrent=2, metrics={"length": length}))  # fmt: skip
    assert "length" not in evens.metrics  # every episode scored itself: no reward metric
