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
    counters = {"running": 6, "episodes_failed": 3, "episodes_timed_out": 2}
    got = rollout_metrics(before, {**counters, "engine": after}, wall_s=10.0)
    assert got == {
        "rollout/groups_in_flight": 6.0,
        "rollout/episodes_failed": 3.0,  # since the run started
        "rollout/episodes_timed_out": 2.0,
        "rollout/engine_busy_frac": 0.5,  # (2 + 3) s of 10
        "rollout/prefill_tokens": 300.0,
        "rollout/reprefilled_tokens": 0.0,
        "rollout/prefix_cached_tokens": 200.0,
        "rollout/decode_rows_per_step": 6.0,  # 60 tokens over 10 steps
    }
    # servers: no engine counters, only what the executor knows
    assert rollout_metrics(None, {"running": 2}, wall_s=10.0) == {
        "rollout/groups_in_flight": 2.0,
        "rollout/episodes_failed": 0.0,
        "rollout/episodes_timed_out": 0.0,
    }


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
    # an agent's own per-episode numbers (metric/<name>), each episode counted once
    noted = [row(1), row(1)]
    for r, met in zip(noted, (1.0, 1.0), strict=True):
        r.metadata["metric/goal_met"] = met
    done = Group.of_episodes("r", [noted, [row(0)]], 0)
    done.trajectories[-1].metadata["metric/goal_met"] = 0.0
    assert agent_metrics([done]) == {"agent/tool_call_share": 0.5, "agent/tool_calls_mean": 0.5,
                                     "agent/goal_met": 0.5}  # fmt: skip


def test_step_metrics_count_episodes_tokens_and_staleness() -> None:
    from core.rollout.api import Group, Trajectory
    from core.runtime.metrics import StepTimes, interrupted_episodes, staleness, step_metrics

    def row(versions: list[int], reward: float, resumed: bool = False) -> Trajectory:
        n = len(versions)
        meta = {"n_resumes": 1} if resumed else {}
        mask = [0] + [1] * (n - 1)
        return Trajectory(list(range(n)), mask, [0.0] * n, [-1, *versions[1:]], reward, 1, meta)

    # step 5: group a generated at version 4 (one episode interrupted: tokens of 4 and 5),
    # group b at version 2; 3 episodes, 6 trained tokens
    a = Group("a", [row([0, 4, 5], 1.0, resumed=True), row([0, 4], 0.0)], 4)
    b = Group("b", [row([0, 2, 2], 1.0)], 2)
    times = StepTimes(wait_s=1.0, train_s=2.5, publish_s=0.5, step_s=4.0)
    got = step_metrics(5, [a, b], 5, {"actor/loss": 0.25, "version": 6.0}, times)
    assert staleness([a, b], 5) == [1, 3] and interrupted_episodes([a, b]) == 1
    assert got["reward/mean"] == pytest.approx(2 / 3)
    assert got["reward/accuracy"] == pytest.approx(2 / 3)
    assert got["staleness/mean"] == 2.0 and got["staleness/max"] == 3.0
    assert got["staleness/token_mean"] == pytest.approx(5 - (4 + 5 + 4 + 2 + 2) / 5)
    assert got["staleness/interrupted_frac"] == pytest.approx(1 / 3)
    assert got["throughput/samples_per_s"] == 0.75 and got["throughput/tokens_per_s"] == 1.25
    assert got["learner/busy_fraction"] == 0.625 and got["time/publish_s"] == 0.5
    assert got["response/mean_tokens"] == pytest.approx(5 / 3)
    assert got["actor/loss"] == 0.25 and "version" not in got  # only actor/ and critic/ stats
