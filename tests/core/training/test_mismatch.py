"""The train/inference mismatch check: the engine's log-prob of each trained token against the
learner's, for every workflow, across an interrupted generation, and its warning.

Tolerance measured here (CPU, fp32, the tiny model, 2026-12-03): the largest |Δ log p| per workflow
below was 1.9e-6 to 4.8e-6 (192 tokens each); ``learner.mismatch_tolerance`` defaults to 1e-3 and
the tests assert 1e-4.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import torch

from core.algorithms import AlgorithmConfig
from core.config import load_config
from core.data import generate_problems
from core.inference.api import GenerationRequest, SamplingParams, WeightSource, generate_resuming
from core.inference.engine.hf_engine import HFEngine
from core.models import create_pretrained, load_model, load_tokenizer
from core.rollout.api import Group, Trajectory, workflow_class
from core.runtime.advantages import with_advantages
from core.runtime.learner_worker import LearnerWorker
from core.runtime.metrics import mismatch_metrics
from core.runtime.trainer import to_batch
from core.training import Learner, PolicyLoss, collate
from core.training.mismatch import MismatchMonitor, generation_call_index

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = 1e-4
G = 4  # episodes per group


# ------------------------------------------------------------------ the monitor by hand
def _row(ids: int, mask: list[int], logprobs: list[float], versions: list[int]) -> Trajectory:
    return Trajectory(list(range(1, ids + 1)), mask, logprobs, versions, 1.0, prompt_len=1)


@pytest.mark.unit
def test_the_monitor_compares_only_tokens_of_the_current_version() -> None:
    rows = [
        _row(5, [0, 1, 1, 0, 1], [0.0, -1.0, -2.0, 0.0, -3.0], [-1, 2, 2, -1, 2]),
        _row(5, [0, 1, 1, 1, 0], [0.0, -1.0, -1.0, -1.0, 0.0], [-1, 1, 2, 2, -1]),
    ]
    batch = collate(rows, pad_id=0)
    learner = batch.behaviour_logprobs.clone()
    learner[0, 4] += 0.5  # the second call of row 0
    learner[1, 1] += 9.0  # a token from version 1: another policy, not checked
    learner[1, 3] -= 0.002
    monitor = MismatchMonitor(version=2, tolerance=1e-3)
    monitor.add(batch, learner)
    s = monitor.summary()
    assert s["mismatch/tokens"] == 5  # 3 + 2 tokens at version 2
    assert s["mismatch/abs_mean"] == pytest.approx((0.5 + 0.002) / 5)
    assert s["mismatch/frac_above_tol"] == pytest.approx(2 / 5)
    assert s["mismatch/abs_max"] == pytest.approx(0.5)
    assert s["mismatch/seq_log_ratio_mean"] == pytest.approx((0.5 - 0.002) / 2)
    assert s["mismatch/later_calls_abs_mean"] == pytest.approx(0.5)  # the one later-call token
    worst = s["worst"]
    assert (worst.row, worst.position, worst.version) == (0, 4, 2)
    assert (worst.engine_logprob, worst.learner_logprob) == pytest.approx((-3.0, -2.5))
    other = MismatchMonitor(version=2, tolerance=1e-3)
    other.add(batch, batch.behaviour_logprobs - 1.0)
    monitor.merge(other)
    assert monitor.summary()["mismatch/tokens"] == 10 and monitor.worst.abs_diff == 1.0
    calls = generation_call_index(batch.loss_mask)
    assert calls[0].tolist() == [-1, 0, 0, -1, 1] and calls[1].tolist() == [-1, 0, 0, 0, -1]


# ------------------------------------------------------------------ every workflow, real engine
@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny chat model taught briefly to open with a ``<calc>`` call (so tagged-tool episodes
    have tool turns); starts from random weights, ~10 s of SFT."""
    torch.set_num_threads(1)
    cfg = load_config(ROOT / "experiments" / "agent_tools.yaml", [])
    problems = generate_problems(64, cfg.data.synthetic, seed=0)
    corpus = [p["question"] + " <calc>3+4</calc> <result>7</result> #### 7" for p in problems]
    folder = create_pretrained("tiny", corpus, tmp_path_factory.mktemp("tool"), vocab_size=400,
                               seed=0, chat=True)  # fmt: skip
    tokenizer = load_tokenizer(folder)
    workflow = workflow_class(cfg.rollout.workflow).from_config(cfg, tokenizer)
    rows = []
    for p in problems[:16]:
        prompt = workflow.prompter.prompt_ids(p["question"])
        answer = tokenizer(" <calc>3+4</calc>", add_special_tokens=False)["input_ids"]
        n = len(prompt) + len(answer)
        rows.append(Trajectory(prompt + answer, [0] * len(prompt) + [1] * len(answer),
                               [0.0] * n, [-1] * n, 0.0, prompt_len=len(prompt)))  # fmt: skip
    workflow.close()
    learner = Learner(folder, lr=1e-2, weight_decay=0.0, max_grad_norm=1.0, warmup_steps=0,
                      total_steps=40, micro_batch_tokens=4096)  # fmt: skip
    batch = collate(rows, tokenizer.pad_token_id)
    for _ in range(40):
        learner.sft_step(batch)
    learner.export_hf(str(folder))
    return folder


WORKFLOWS = {
    "rlvr": ("quickstart.yaml", []),
    "tagged-tools": ("agent_tools.yaml", ["tools.latency_s=0"]),
    "openai-agent": ("agent_openai.yaml", ["tools.latency_s=0"]),
    "openai-agent-per-turn": (
        "agent_openai.yaml",
        ["tools.latency_s=0", "agent.trajectory_mode=per_turn"],
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_engine_and_learner_agree_on_every_trained_token(tool_model: Path, name: str) -> None:
    """A group of episodes per workflow on our engine, trained by the real learner path: every
    generated token's engine log-prob equals the learner's to ~1e-6 (fp32, CPU)."""
    recipe, overrides = WORKFLOWS[name]
    cfg = load_config(ROOT / "experiments" / recipe, [*overrides, f"algorithm.group_size={G}",
                                                      "sampling.max_new_tokens=24"])  # fmt: skip
    tokenizer = load_tokenizer(tool_model)
    workflow = workflow_class(cfg.rollout.workflow).from_config(cfg, tokenizer)
    problems = generate_problems(2, cfg.data.synthetic, seed=1)

    async def groups(engine: HFEngine) -> list[Group]:
        out = []
        for p in problems:
            episodes = [await workflow.run_episode(engine, {**p, "seed": 10 * i}) for i in range(G)]
            rows = [e if isinstance(e, list) else [e] for e in episodes]
            out.append(Group.of_episodes(p["id"], rows, 0))
        return out

    with HFEngine(load_model(tool_model), tokenizer, seed=0) as engine:
        batch_groups = asyncio.run(groups(engine))
    workflow.close()
    rows = [t for g in batch_groups for t in g.trajectories]
    if name == "tagged-tools":  # the model opens with a call: tool results are in the rows
        assert any(t.metadata["turns"] > 1 for t in rows)
    if name.startswith("openai"):
        assert all(t.call_lengths for t in rows)
    batch = to_batch(batch_groups, tokenizer.pad_token_id)
    batch = with_advantages(batch, cfg.algorithm, max_new_tokens=cfg.sampling.max_new_tokens)
    stats = LearnerWorker(cfg, str(tool_model)).rl_update(batch)
    assert stats["mismatch/tokens"] == batch.n_loss_tokens > 0
    assert stats["mismatch/abs_max"] < TOLERANCE, stats
    assert stats["mismatch/frac_above_tol"] == 0.0
    assert abs(stats["mismatch/seq_log_ratio_mean"]) < TOLERANCE


@pytest.mark.integration
def test_an_interrupted_generation_is_checked_against_the_new_weights(
    tool_model: Path, tmp_path: Path
) -> None:
    """Aborted mid-generation, weights updated to version 1, resumed: the tokens stamped 1 match
    a learner holding those weights (and the check skips the version-0 tokens)."""
    tokenizer = load_tokenizer(tool_model)
    newer = load_model(tool_model)
    with torch.no_grad():
        for p in newer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    newer.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    prompt = tokenizer("Question: 2+2?", add_special_tokens=False)["input_ids"]
    sampling = SamplingParams(max_new_tokens=40, temperature=1.0, seed=3, stop_token_ids=[])

    async def interrupted(engine: HFEngine):
        task = asyncio.ensure_future(generate_resuming(engine, GenerationRequest(prompt, sampling)))
        while engine.tokens_generated < 5:
            await asyncio.sleep(0.001)
        await engine.pause()
        await engine.update_weights(WeightSource(path=str(tmp_path)), 1)
        await engine.resume()
        return await task

    with HFEngine(load_model(tool_model), tokenizer, seed=0) as engine:
        response = asyncio.run(interrupted(engine))
    assert response.n_resumes >= 1 and {0, 1} <= set(response.versions)
    n = len(prompt) + len(response.output_ids)
    row = Trajectory(prompt + response.output_ids, [0] * len(prompt) + [1] * len(response.output_ids),
                     [0.0] * len(prompt) + response.logprobs, [-1] * len(prompt) + response.versions,
                     1.0, prompt_len=len(prompt))  # fmt: skip
    assert len(row.input_ids) == n
    batch = collate([row], tokenizer.pad_token_id)
    monitor = MismatchMonitor(version=1, tolerance=1e-3)
    learner = Learner(tmp_path, lr=1e-3, weight_decay=0.0, max_grad_norm=1.0, warmup_steps=0,
                      total_steps=1, micro_batch_tokens=4096)  # fmt: skip
    monitor.add(batch, learner.compute_logprobs(batch))
    summary = monitor.summary()
    assert summary["mismatch/tokens"] == response.versions.count(1)
    assert summary["mismatch/abs_max"] < TOLERANCE
    stale = MismatchMonitor(version=0, tolerance=1e-3)  # the old tokens vs the new weights
    stale.add(batch, learner.compute_logprobs(batch))
    assert stale.summary()["mismatch/abs_max"] > 1e-3  # they were not made by these weights


@pytest.mark.unit
def test_a_mismatched_step_warns_with_the_worst_sample(caplog) -> None:
    groups = [
        Group("sample-a", [_row(3, [0, 1, 1], [0.0, -1.0, -1.0], [-1, 0, 0])] * 2, 0),
        Group("sample-b", [_row(3, [0, 1, 1], [0.0, -1.0, -1.0], [-1, 0, 0])] * 2, 0),
    ]
    batch = to_batch(groups, pad_id=0)
    learner = batch.behaviour_logprobs.clone()
    learner[3, 2] += 0.7  # sample-b's second episode, token 2
    monitor = MismatchMonitor(version=0, tolerance=1e-3)
    monitor.add(batch, learner)
    summary = monitor.summary()
    worst = summary.pop("worst")
    stats = {**summary, **{f"mismatch/worst_{k}": float(v) for k, v in vars(worst).items()}}
    with caplog.at_level(logging.WARNING):
        metrics = mismatch_metrics(stats, groups, 7, tolerance=1e-3, warn_frac=0.1)
    assert metrics["mismatch/abs_max"] == pytest.approx(0.7)
    assert not any(k.startswith("mismatch/worst_") for k in metrics)
    (record,) = caplog.records
    assert "step 7" in record.message and "sample sample-b, episode 1" in record.message
    assert "batch row 3, token 2" in record.message and "expected" not in record.message
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        mismatch_metrics(stats, groups, 7, tolerance=1e-3, warn_frac=0.1, kept_kv=True)
    assert "expected with inference.kv_after_update=keep" in caplog.records[0].message
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        mismatch_metrics(stats, groups, 7, tolerance=1e-3, warn_frac=0.2)  # 1 of 8 = 0.125
    assert not caplog.records


@pytest.mark.unit
def test_the_learner_checks_only_where_its_log_probs_are_exact(tool_model: Path) -> None:
    """One optimiser step or a recomputed π_prox: checked. The log-linear π_prox over several
    minibatches has no exact pass after the first step: no mismatch metrics then."""
    tokenizer = load_tokenizer(tool_model)
    row = _row(4, [0, 1, 1, 1], [0.0, -1.0, -1.0, -1.0], [-1, 0, 0, 0])
    batch = collate([row] * 4, tokenizer.pad_token_id)
    batch = batch.with_fields(advantages=torch.ones_like(batch.loss_mask))
    base = "experiments/quickstart.yaml"
    for overrides, checked in (
        (["algorithm.ppo_n_minibatches=1", "algorithm.group_size=2"], True),
        (["algorithm.ppo_n_minibatches=2", "algorithm.group_size=2"], True),
        (["algorithm.ppo_n_minibatches=2", "algorithm.group_size=2",
          "algorithm.use_loglinear_proximal=true"], False),
    ):  # fmt: skip
        cfg = load_config(ROOT / base, overrides)
        stats = LearnerWorker(cfg, str(tool_model)).rl_update(batch)
        assert ("mismatch/abs_max" in stats) is checked, overrides
    assert isinstance(PolicyLoss(AlgorithmConfig()).mismatch, type(None))


@pytest.mark.e2e
def test_lr_zero_canary_keeps_the_policy_and_the_mismatch_at_zero(tmp_path: Path) -> None:
    """A short async run (η = 2) at lr = 0: every version is the starting policy, so every
    trained token's engine log-prob must equal the learner's, stale ones included (behaviour
    weights 1), and the final model is the initial one."""
    from core.runtime.job import run_experiment
    from tests.core.runtime.test_trainer import QUICKSTART, TINY, read_jsonl

    cfg = load_config(QUICKSTART, [*TINY, f"cluster.fileroot={tmp_path}", "experiment.trial=t",
                                   "rollout.max_staleness=2", "learner.total_steps=3",
                                   "algorithm.lr=0", "rollout.adaptive_staleness=false"])  # fmt: skip
    summary = run_experiment(cfg)
    steps = [m for m in read_jsonl(tmp_path / "quickstart" / "t" / "metrics.jsonl")
             if "mismatch/tokens" in m]  # fmt: skip
    assert len(steps) == 3
    assert steps[0]["mismatch/tokens"] > 0  # later steps may train only older tokens
    for m in steps:
        assert m["mismatch/abs_max"] < TOLERANCE, m
        assert m["actor/behav_weight_max"] == pytest.approx(1.0, abs=1e-3)
        assert m["actor/behav_weight_min"] == pytest.approx(1.0, abs=1e-3)
    assert max(m["staleness/max"] for m in steps) >= 1  # stale batches were trained
    start = load_model(tmp_path / "quickstart" / "t" / "model_init")
    final = load_model(summary["final_model_dir"])
    for a, b in zip(start.parameters(), final.parameters(), strict=True):
        assert torch.equal(a, b)
