"""math-verify answers, and rewards scored off the event loop with a time limit per call."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.rewards.math import math_reward
from core.rewards.verifier_pool import InlineScorer, VerifierPool, make_scorer


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("we get $x^2 + 2x + 1$", "$(x+1)^2$", 1.0),
        ("Total: 3+4=7. #### 7", "4 + 3 = 7 #### 7", 1.0),  # GSM8K: the final number
        ("\\boxed{8}", "7", 0.0),
        ("no answer here", "7", 0.0),
    ],
)
def test_math_reward(completion: str, reference: str, expected: float) -> None:
    assert math_reward(completion, reference) == expected


def test_math_reward_works_off_the_main_thread() -> None:
    """math-verify's own timeout needs the main thread; elsewhere it must still answer."""
    assert asyncio.run(asyncio.to_thread(math_reward, "\\boxed{2}", "2")) == 1.0


@pytest.mark.integration
def test_the_pool_scores_off_the_loop_and_bounds_each_call() -> None:
    async def main() -> tuple[list[float], float, dict, float]:
        pool = VerifierPool("tests.experiments.slow_rewards:sleepy", workers=2, timeout_s=2.0)
        try:
            await pool("warm", "up")  # the processes import the reward once
            ticks = 0

            async def ticker() -> None:  # the event loop stays free while a verifier hangs
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.05)
                    ticks += 1

            tick = asyncio.create_task(ticker())
            started = time.monotonic()
            scores = await asyncio.gather(
                pool("hang", "x"), pool("a", "a"), pool("b", "c"), pool("d", "d")
            )
            elapsed = time.monotonic() - started
            tick.cancel()
            again = await pool("e", "e")  # the hung process was replaced
            return scores, elapsed, pool.stats(), ticks, again
        finally:
            pool.close()

    scores, elapsed, stats, ticks, again = asyncio.run(main())
    assert scores == [0.0, 1.0, 0.0, 1.0] and again == 1.0
    assert stats["timeouts"] == 1 and stats["failures"] == 1
    assert 2.0 <= elapsed < 10 and ticks >= 20


@pytest.mark.integration
def test_a_crashing_verifier_scores_zero_and_is_counted() -> None:
    async def main() -> tuple[float, dict]:
        pool = VerifierPool("tests.experiments.slow_rewards:broken", workers=1, timeout_s=10)
        try:
            return await pool("a", "a"), pool.stats()
        finally:
            pool.close()

    score, stats = asyncio.run(main())
    assert score == 0.0 and stats == {"calls": 1, "failures": 1, "timeouts": 0}


def test_make_scorer_chooses_inline_without_workers() -> None:
    assert isinstance(make_scorer("core.rewards.gsm8k:gsm8k_reward"), InlineScorer)
    with pytest.raises(ValueError, match="no_such"):
        VerifierPool("core.rewards.gsm8k:no_such", workers=1)


@pytest.mark.e2e
def test_a_run_scored_by_math_verify_in_verifier_processes(tmp_path) -> None:
    from pathlib import Path

    import psutil

    from core.config import load_config
    from core.runtime.job import run_experiment

    quickstart = Path(__file__).resolve().parents[3] / "experiments" / "quickstart.yaml"
    cfg = load_config(
        quickstart,
        [f"cluster.fileroot={tmp_path}", "experiment.trial=m", "data.n_train=100",
         "data.n_test=16", "eval.n_problems=16", "sft.enabled=false", "learner.total_steps=2",
         "rollout.batch_size=4", "eval.every_n_steps=0", "checkpoint.every_n_steps=0",
         "rollout.reward_fn=core.rewards.math:math_reward", "rollout.reward_workers=1"],
    )  # fmt: skip
    summary = run_experiment(cfg)
    # every episode and eval answer went through the verifier process (unit tests above show
    # what math-verify accepts); the run finished and its verifiers are gone
    assert summary["steps"] == 2 and 0.0 <= summary["accuracy_after"] <= 1.0
    verifiers = [
        p
        for p in psutil.Process().children(recursive=True)
        if "core.rewards.verifier_pool" in " ".join(p.cmdline())
    ]
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in verifiers)
