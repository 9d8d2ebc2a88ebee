"""Resolving rewards by import path, and SafeReward's failure accounting."""

import logging
import math
import pickle

import pytest

from core.rewards import SafeReward, gsm8k_reward, resolve_reward

pytestmark = pytest.mark.unit

GOOD = "core.rewards.gsm8k:gsm8k_reward"


def raising(completion: str, reference: str) -> float:
    raise RuntimeError(f"boom on {completion!r}")


def nan_reward(completion: str, reference: str) -> float:
    return math.nan


def half(completion: str, reference: str) -> float:
    return 0.5


def test_resolve_good_path() -> None:
    assert resolve_reward(GOOD) is gsm8k_reward
    assert resolve_reward(f"  {GOOD} ") is gsm8k_reward
    assert resolve_reward(GOOD)("#### 18", "18") == 1.0


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("core.rewards.gsm8k.gsm8k_reward", "not of the form"),
        ("core.rewards.gsm8k:", "not of the form"),
        (":gsm8k_reward", "not of the form"),
        ("core/rewards/gsm8k:gsm8k_reward", "not of the form"),
        ("", "not of the form"),
        ("core.rewards.nope:gsm8k_reward", "cannot import module"),
        ("core.rewards.gsm8k:nope", "has no attribute"),
        ("core.rewards.gsm8k:REL_TOL", "not a callable"),
        ("core.rewards.gsm8k:extract_answer", "cannot be called as fn"),
    ],
)
def test_resolve_bad_path(path: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        resolve_reward(path)
    assert repr(path) in str(info.value)


def test_resolve_non_string() -> None:
    with pytest.raises(ValueError, match="not of the form"):
        resolve_reward(None)  # type: ignore[arg-type]


def test_safe_reward_passes_values_through() -> None:
    safe = SafeReward(gsm8k_reward)
    assert safe("#### 18", "18") == 1.0
    assert safe("#### 17", "18") == 0.0
    assert SafeReward(half)("x", "y") == 0.5
    assert SafeReward(lambda c, r: True)("x", "y") == 1.0
    assert (safe.n_calls, safe.n_failures, safe.last_error) == (2, 0, None)


def test_safe_reward_counts_exceptions(caplog: pytest.LogCaptureFixture) -> None:
    safe = SafeReward(raising)
    with caplog.at_level(logging.WARNING, logger="core.rewards.registry"):
        assert safe("a", "b") == 0.0
    assert (safe.n_calls, safe.n_failures) == (1, 1)
    assert "RuntimeError" in safe.last_error and "boom" in safe.last_error
    assert "raising" in caplog.text


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None, "1.0", [1.0]], ids=repr)
def test_safe_reward_rejects_non_finite_and_non_numeric(value: object) -> None:
    safe = SafeReward(lambda c, r: value)
    assert safe("a", "b") == 0.0
    assert safe.n_failures == 1
    assert safe.last_error is not None


def test_safe_reward_nan_fn_is_counted_every_call() -> None:
    safe = SafeReward(nan_reward)
    results = [safe("a", "b") for _ in range(4)]
    assert results == [0.0] * 4
    assert (safe.n_calls, safe.n_failures, safe.failure_rate) == (4, 4, 1.0)
    assert "non-finite" in safe.last_error


def test_safe_reward_warns_only_for_the_first_failures(caplog: pytest.LogCaptureFixture) -> None:
    safe = SafeReward(raising, max_warnings=3)
    with caplog.at_level(logging.WARNING, logger="core.rewards.registry"):
        for i in range(10):
            safe(str(i), "b")
    assert safe.n_failures == 10
    assert len(caplog.records) == 3
    assert "not logged" in caplog.records[-1].getMessage()
    assert "'9'" in safe.last_error  # the newest error is kept even when not logged


def test_safe_reward_does_not_swallow_keyboard_interrupt() -> None:
    def interrupted(completion: str, reference: str) -> float:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        SafeReward(interrupted)("a", "b")


def test_safe_reward_from_path_and_pickle() -> None:
    safe = SafeReward.from_path(GOOD)
    assert safe.name == GOOD
    assert safe("The answer is 18.", "#### 18") == 1.0
    clone = pickle.loads(pickle.dumps(safe))  # rollout workers receive it by pickle
    assert clone("#### 18", "18") == 1.0
    assert clone.n_calls == 2
    with pytest.raises(ValueError, match="has no attribute"):
        SafeReward.from_path("core.rewards.gsm8k:missing")
