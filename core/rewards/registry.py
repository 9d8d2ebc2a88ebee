"""Look up reward functions by import path and wrap them so a bad reward never kills a run.

Experiments name their reward as ``"module.sub:function"`` (for example
``"core.rewards.gsm8k:gsm8k_reward"``), which keeps configs plain data and lets rollout
workers on other machines resolve the same function.
"""

import functools
import inspect
import logging
import math
import numbers
from collections.abc import Callable

from core.plugins import load_object

logger = logging.getLogger(__name__)

RewardFn = Callable[[str, str], float]
CompletionMetric = Callable[[str], float]


def _check_arity(fn: Callable[..., object], path: str) -> None:
    """Fail at config time, not mid-rollout, when fn cannot take (completion, reference)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some builtins have no signature; let the call itself decide
    try:
        signature.bind("completion", "reference")
    except TypeError as exc:
        msg = f"reward {path!r} cannot be called as fn(completion, reference): {exc}"
        raise ValueError(msg) from exc


def resolve_reward(path: str) -> RewardFn:
    """Import the reward function named by ``"module.sub:function"``.

    Raises ValueError naming ``path`` when the format is wrong, the module or attribute is
    missing, or the attribute is not callable with two positional arguments.
    """
    target = load_object(path, "reward")
    if not callable(target):
        raise ValueError(f"reward {path!r} is a {type(target).__name__}, not a callable")
    _check_arity(target, path)
    return target


def with_completion_metrics(**metrics: CompletionMetric) -> Callable[[RewardFn], RewardFn]:
    """Declare a task's own eval metrics on its reward function.

    The held-out eval reports the mean of each ``metric(completion)`` beside accuracy (GSM8K
    declares ``direct_share``: how often the model answers without working). Generic code never
    names a task's metrics; it asks :func:`completion_metrics`.
    """

    def attach(fn: RewardFn) -> RewardFn:
        fn.completion_metrics = dict(metrics)  # type: ignore[attr-defined]
        return fn

    return attach


def completion_metrics(reward: str | RewardFn) -> dict[str, CompletionMetric]:
    """The metrics a reward function declared with :func:`with_completion_metrics` (maybe none)."""
    fn = resolve_reward(reward) if isinstance(reward, str) else reward
    return dict(getattr(fn, "completion_metrics", {}))


def blocking(fn: RewardFn) -> RewardFn:
    """Mark a reward that waits (on a subprocess: the code reward's sandboxed tests).

    Called inline (``rollout.reward_workers=0``) it runs in a worker thread, so the rollout's
    event loop keeps generating while it waits; in the verifier pool nothing changes.
    """
    fn.blocking = True  # type: ignore[attr-defined]
    return fn


def is_blocking(fn: object) -> bool:
    return bool(getattr(fn, "blocking", False))


def bind_settings(fn: RewardFn, settings: dict[str, object] | None) -> RewardFn:
    """``fn`` with the ``settings`` it names as keyword parameters bound; the others are dropped.

    Settings are config values a reward may need beyond (completion, reference), such as the
    sandbox policy of a reward that runs code; a reward that does not name one never sees it.
    Marks (:func:`blocking`, completion metrics) carry over to the bound function.
    """
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    by_keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = {
        key: value
        for key, value in (settings or {}).items()
        if key in parameters and parameters[key].kind in by_keyword
    }
    if not named:
        return fn
    return functools.update_wrapper(functools.partial(fn, **named), fn)


class SafeReward:
    """Call a reward function, turning any failure into a 0.0 reward and a counted error.

    A failure is an exception (``Exception`` only: Ctrl-C and SystemExit still stop the run) or
    a result that is not a finite real number. Only the first ``max_warnings`` failures are
    logged so a systematically broken reward cannot flood the logs. The counters are plain
    attributes so the wrapper stays picklable for remote workers; under threads they are
    best-effort statistics.
    """

    def __init__(self, fn: RewardFn, *, name: str | None = None, max_warnings: int = 5) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.max_warnings = max_warnings
        self.n_calls = 0
        self.n_failures = 0
        self.last_error: str | None = None

    @classmethod
    def from_path(cls, path: str, *, max_warnings: int = 5) -> "SafeReward":
        """Resolve ``"module.sub:function"`` and wrap it; a bad path still raises ValueError."""
        return cls(resolve_reward(path), name=path, max_warnings=max_warnings)

    @property
    def failure_rate(self) -> float:
        return self.n_failures / self.n_calls if self.n_calls else 0.0

    def __call__(self, completion: str, reference: str) -> float:
        self.n_calls += 1
        try:
            value = self.fn(completion, reference)
        except Exception as exc:  # any reward bug must cost one sample, not the run
            return self._fail(f"raised {type(exc).__name__}: {exc}")
        # bool is a Real (True -> 1.0), which suits match-style rewards; str/None/tensors are not.
        if not isinstance(value, numbers.Real):
            return self._fail(f"returned {type(value).__name__} {value!r:.80}, not a number")
        result = float(value)
        if not math.isfinite(result):
            return self._fail(f"returned non-finite {result}")
        return result

    def _fail(self, error: str) -> float:
        self.n_failures += 1
        self.last_error = error
        if self.n_failures <= self.max_warnings:
            last = self.n_failures == self.max_warnings
            suffix = " (further failures are counted, not logged)" if last else ""
            logger.warning("reward %s %s -> 0.0%s", self.name, error, suffix)
        return 0.0

    def __repr__(self) -> str:
        return f"SafeReward({self.name}, calls={self.n_calls}, failures={self.n_failures})"
