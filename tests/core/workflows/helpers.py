"""Helpers shared by the agent tests (imported as ``tests.core.workflows.helpers``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openai.types.chat import ChatCompletion


class ReplayClient:
    """Stands in for the model behind ``episode.client``: replies with a solved conversation's
    assistant turns, in order, as the SDK's ChatCompletion; keeps what it was sent."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.turns = iter(turns)
        self.sent: list[list[Any]] = []
        self.tools: list[Any] = []  # the tools each call listed
        self.chat = self
        self.completions = self

    async def create(self, messages: list[Any], tools: Any = None, **_: object) -> ChatCompletion:
        self.sent.append(list(messages))
        self.tools.append(tools)
        turn = next(self.turns)
        message: dict[str, Any] = {"role": "assistant", "content": turn["content"] or None}
        if turn.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "function": {"name": c["function"]["name"],
                                   "arguments": json.dumps(c["function"]["arguments"])}}
                for c in turn["tool_calls"]
            ]  # fmt: skip
        return ChatCompletion.model_validate({
            "id": "r", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        })  # fmt: skip


def trained_spans(tokenizer: Any, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded runs of consecutive trained tokens (``mask`` 1), in order."""
    spans, current = [], []
    for token, m in zip(ids, mask, strict=True):
        if m:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    spans.append(tokenizer.decode(current))
    return spans


def two_step_run(recipe: Path, tmp_path: Path, *overrides: str) -> tuple[Path, dict[str, Any]]:
    """Run ``recipe`` for what :func:`two_trained_steps` checks (a 10-step SFT on 32 samples,
    2 RL steps of 2 prompts × 2 samples, 4 held out) under ``tmp_path``, through the Prefect
    experiment flow as ``asyncrl run`` does (the caller asks for the ``harness`` fixture);
    checks the flow's MLflow run; returns (run dir, summary)."""
    return flow_run(recipe, tmp_path, [
        "data.n_train=32", "data.n_test=4", "sft.steps=10", "rollout.batch_size=2",
        "algorithm.group_size=2", "learner.total_steps=2", "eval.every_n_steps=0", *overrides,
    ])  # fmt: skip


def flow_run(recipe: Path, tmp_path: Path, overrides: list[str]) -> tuple[Path, dict[str, Any]]:
    """Run ``recipe`` with ``overrides`` under ``tmp_path`` through the Prefect experiment flow
    (``flows.experiment``: the path of ``asyncrl run``, an ablation's variants and a sweep's
    trials), and check what it leaves in MLflow: a finished run with the config's parameters
    and each evaluation's accuracy and per-task columns. Returns (run dir, summary)."""
    import mlflow  # the heavy imports only where a run is made

    from core.config import load_config
    from flows.experiment import experiment
    from tasks.mlflow_tracking import sanitize_key

    config = load_config(recipe, [f"cluster.fileroot={tmp_path}", "experiment.trial=t", *overrides])
    result = experiment(config)
    summary = result["summary"]
    client = mlflow.MlflowClient(summary["mlflow_tracking_uri"])
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["data.source"] == config.data.source
    assert run.data.tags["prefect_flow_run_id"] == summary["prefect_flow_run_id"] != ""
    evals = summary["evals"]

    def logged(key: str) -> list[tuple[int, float]]:
        history = client.get_metric_history(run.info.run_id, sanitize_key(key))
        return [(m.step, m.value) for m in history]

    assert logged("eval/accuracy") == [(e["version"], e["accuracy"]) for e in evals]
    for key in evals[-1]["metrics"]:
        if key.startswith("accuracy/"):  # per task (goal, kind), where the task has several
            assert logged(f"eval/{key}") == [(e["version"], e["metrics"][key]) for e in evals]
    return tmp_path / config.experiment.name / "t", summary


def two_trained_steps(run_dir: Path, summary: dict[str, Any], n_test: int) -> list[float]:
    """Check a run of 2 RL steps of 2 prompts × 2 samples: both steps trained, both evals held
    ``n_test`` problems, and the engine's log-probs through the agent's client equal the
    learner's (fp32) on the first step; returns the trained rewards."""
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == [0, 1]
    rewards = [r for b in batches for group in b["rewards"] for r in group]
    assert len(rewards) == 2 * 2 * 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert [e["n"] for e in summary["evals"]] == [n_test, n_test]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in metrics if "mismatch/tokens" in m)
    assert first["mismatch/tokens"] > 0 and first["mismatch/abs_max"] < 1e-3, first
    return rewards
