"""The code reward: tests run in the sandbox, by fraction or all-pass; what fails scores 0, counted."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from core.config import Config
from core.rewards import code
from core.rewards.code import all_tests_pass, extract_code, parse_tests
from core.rewards.code import tests_passed_fraction as fraction  # not collected as a test
from core.rewards.registry import SafeReward, bind_settings, completion_metrics
from core.rewards.verifier_pool import InlineScorer, VerifierPool, make_scorer, scorer_from_config
from core.sandbox import Isolation
from core.sandbox import run as sandbox

TESTS = json.dumps(["assert f(1) == 4", "assert f(2) == 5", "assert f(-3) == 0"])
RIGHT = "def f(x):\n    return x + 3"
PARTLY = "def f(x):\n    return x + 3 if x > 0 else 99"  # passes 2 of 3
FAST = {"sandbox_timeout_s": 2.0}


def outcome_delta(before: dict, after: dict) -> dict[str, int]:
    delta = {k: after["outcomes"][k] - before["outcomes"][k] for k in code.OUTCOMES}
    return {k: v for k, v in delta.items() if v}


def test_right_code_scores_one_and_partly_right_scores_the_fraction() -> None:
    assert fraction(RIGHT, TESTS, **FAST) == 1.0
    assert all_tests_pass(RIGHT, TESTS, **FAST) == 1.0
    assert fraction(PARTLY, TESTS, **FAST) == pytest.approx(2 / 3)
    assert all_tests_pass(PARTLY, TESTS, **FAST) == 0.0
    assert fraction("def f(x):\n    return -1", TESTS, **FAST) == 0.0


def test_code_is_taken_from_a_fenced_block_or_the_whole_completion() -> None:
    fenced = f"Here you go:\n```python\n{RIGHT}\n```\nDone. f(1) is 4."
    assert extract_code(fenced) == RIGHT
    assert extract_code(f"```py\n{RIGHT}") == RIGHT  # closing fence optional
    assert extract_code("  def f(x):\n      return x + 3\n") == RIGHT  # dedented
    assert all_tests_pass(fenced, TESTS, **FAST) == 1.0
    assert all_tests_pass("Here you go: " + RIGHT, TESTS, **FAST) == 0.0  # prose is not code


def test_reference_forms_and_a_malformed_reference_raises() -> None:
    assert parse_tests(TESTS) == parse_tests(json.dumps({"tests": json.loads(TESTS)}))
    for bad in ("assert f(1) == 4", "[]", '{"asserts": ["x"]}', "[1, 2]"):
        with pytest.raises(ValueError, match="code reference"):
            parse_tests(bad)
    safe = SafeReward(all_tests_pass)
    assert safe(RIGHT, "not json") == 0.0 and safe.n_failures == 1  # a data bug is counted


def test_syntax_errors_and_empty_code_score_zero_without_a_sandbox_run() -> None:
    before = code.stats()
    assert all_tests_pass("def f(x) return x + 3", TESTS, **FAST) == 0.0
    assert fraction("```python\n```", TESTS, **FAST) == 0.0
    after = code.stats()
    assert outcome_delta(before, after) == {"syntax_error": 1, "no_code": 1}
    assert after["sandbox_runs"] == before["sandbox_runs"]


def test_an_infinite_loop_scores_zero_within_the_time_limit_and_is_counted() -> None:
    looping = "def f(x):\n    while True:\n        pass"
    before = code.stats()
    started = time.monotonic()
    assert fraction(looping, TESTS, sandbox_timeout_s=0.5) == 0.0
    assert time.monotonic() - started < 3.0
    assert outcome_delta(before, code.stats()) == {"timeout": 1}


def test_passes_before_a_hang_or_a_crash_still_count() -> None:
    hangs_on_negative = "def f(x):\n    while x < 0:\n        pass\n    return x + 3"
    assert fraction(hangs_on_negative, TESTS, sandbox_timeout_s=1.0) == (pytest.approx(2 / 3))
    exits = "import sys\ndef f(x):\n    if x < 0:\n        sys.exit(0)\n    return x + 3"
    assert fraction(exits, TESTS, **FAST) == pytest.approx(2 / 3)
    before = code.stats()
    assert fraction(f"{RIGHT}\nraise RuntimeError('at import')", TESTS) == 0.0
    assert outcome_delta(before, code.stats()) == {"error": 1}


def test_a_socket_or_a_write_outside_the_sandbox_scores_zero(tmp_path: Path) -> None:
    target = tmp_path / "written.txt"
    writes = f"def f(x):\n    open({str(target)!r}, 'w').write('x')\n    return x + 3"
    connects = (
        "import socket\ndef f(x):\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=1)\n    return x + 3"
    )
    assert fraction(writes, TESTS, **FAST) == 0.0
    assert fraction(connects, TESTS, **FAST) == 0.0
    assert not target.exists()


def test_printed_lines_cannot_fake_a_pass() -> None:
    # the solution's stdout goes to /dev/null; even lines written to fd 1 lack the nonce
    fake = "import os\nos.write(1, b'0 0\\n0 1\\n0 2\\n')\nprint('0 0')\ndef f(x):\n    return -1"
    assert fraction(fake, TESTS, **FAST) == 0.0


def test_identical_code_and_tests_run_in_the_sandbox_once() -> None:
    distinct = "def f(x):\n    return x + 3  # cached"
    first = code.stats()
    assert all_tests_pass(distinct, TESTS, **FAST) == 1.0
    assert fraction(distinct, TESTS, **FAST) == 1.0
    after = code.stats()
    assert after["sandbox_runs"] == first["sandbox_runs"] + 1
    assert outcome_delta(first, after) == {"passed": 2}


def test_strict_sandbox_refusal_is_a_counted_reward_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = sandbox.isolation()
    fake = Isolation(real.available - {"seccomp"}, {"seccomp": "none here (test)"})
    monkeypatch.setattr(sandbox, "isolation", lambda: fake)
    refusing = "def f(x):\n    return x + 3  # refused"
    strict = SafeReward(bind_settings(all_tests_pass, {"sandbox": "strict"}))
    assert strict(refusing, TESTS) == 0.0 and strict.n_failures == 1
    assert "sandbox refused" in (strict.last_error or "")
    assert all_tests_pass(refusing, TESTS, sandbox="best_effort", **FAST) == 1.0


def test_the_config_reaches_the_reward_and_it_runs_off_the_event_loop() -> None:
    config = Config()
    config.rollout.reward_fn = "core.rewards.code:tests_passed_fraction"
    config.tools.sandbox, config.tools.timeout_s = "best_effort", 0.5
    scorer = scorer_from_config(config)
    assert isinstance(scorer, InlineScorer) and scorer.in_thread
    assert scorer.reward.fn.keywords == {"sandbox": "best_effort", "sandbox_timeout_s": 0.5}
    looping = "def f(x):\n    while True:\n        pass  # off the loop"

    async def main() -> tuple[float, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        tick = asyncio.create_task(ticker())
        score = await scorer(looping, TESTS)
        tick.cancel()
        return score, ticks

    score, ticks = asyncio.run(main())
    assert score == 0.0 and ticks >= 10  # the loop kept running during the 0.5 s test run
    assert completion_metrics(config.rollout.reward_fn)["compiles"](RIGHT)


@pytest.mark.integration
def test_the_verifier_pool_gets_the_settings() -> None:
    async def main() -> tuple[list[float], dict]:
        pool = make_scorer(
            "core.rewards.code:tests_passed_fraction",
            workers=1,
            timeout_s=10.0,
            settings={"sandbox": "strict", "sandbox_timeout_s": 0.5, "unused": 1},
        )
        assert isinstance(pool, VerifierPool)
        try:
            looping = "def f(x):\n    while True:\n        pass  # in the pool"
            scores = [await pool(RIGHT, TESTS), await pool(PARTLY, TESTS)]
            started = time.monotonic()
            scores.append(await pool(looping, TESTS))  # the sandbox's 0.5 s, not the pool's 10 s
            assert time.monotonic() - started < 5.0
            return scores, pool.stats()
        finally:
            pool.close()

    scores, stats = asyncio.run(main())
    assert scores == [1.0, pytest.approx(2 / 3), 0.0]
    assert stats == {"calls": 3, "failures": 0, "timeouts": 0}
