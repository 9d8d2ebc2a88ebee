"""The rollout side's per-step metrics, from the worker's counters at a step's start and end."""

from __future__ import annotations

import pytest

from core.runtime.metrics import rollout_metrics

pytestmark = pytest.mark.unit


def test_rollout_metrics_are_the_steps_differences() -> None:
    before = {"prefill_s": 1.0, "decode_s": 2.0, "prefill_tokens": 100, "reprefilled_tokens": 10,
              "prefix_cached_tokens": 50, "tokens_generated": 40, "decode_steps": 10,
              "mean_batch_size": 3.0}  # fmt: skip
    after = {"prefill_s": 3.0, "decode_s": 5.0, "prefill_tokens": 400, "reprefilled_tokens": 10,
             "prefix_cached_tokens": 250, "tokens_generated": 100, "decode_steps": 20,
             "mean_batch_size": 5.0}  # fmt: skip
    got = rollout_metrics(before, {"running": 6, "engine": after}, wall_s=10.0)
    assert got == {
        "rollout/groups_in_flight": 6.0,
        "rollout/engine_busy_frac": 0.5,  # (2 + 3) s of 10
        "rollout/prefill_tokens": 300.0,
        "rollout/reprefilled_tokens": 0.0,
        "rollout/prefix_cached_tokens": 200.0,
        "rollout/decode_rows_per_step": 6.0,  # 60 tokens over 10 steps
    }
    # servers: no engine counters, only what the executor knows
    assert rollout_metrics(None, {"running": 2}, wall_s=10.0) == {"rollout/groups_in_flight": 2.0}


def test_agent_metrics_count_each_episode_once() -> None:
    from core.rollout.api import Group, Trajectory
    from core.runtime.metrics import agent_metrics

    def row(calls: int | None) -> Trajectory:
        meta = {} if calls is None else {"tool_calls": calls}
        return Trajectory([1, 2], [0, 1], [0.0, -1.0], [-1, 0], 1.0, prompt_len=1, metadata=meta)

    # episode 0: two per-turn rows (2 calls), episode 1: one row (0 calls)
    group = Group.of_episodes("p", [[row(2), row(2)], [row(0)]], 0)
    assert agent_metrics([group]) == {"agent/tool_call_share": 0.5, "agent/tool_calls_mean": 1.0}
    assert agent_metrics([Group("q", [row(None)], 0)]) == {}  # a workflow that does not count
