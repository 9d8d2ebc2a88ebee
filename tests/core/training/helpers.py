"""Shared data builders and the rank functions that ``spawn_local`` runs (importable by name)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from core.algorithms import AlgorithmConfig
from core.models import load_model
from core.rollout.api import Trajectory
from core.training import (
    Learner,
    LoraSpec,
    PolicyLoss,
    TrainBatch,
    ValueLoss,
    collate,
    get_rank,
    get_world_size,
    shard_rows,
    token_logprobs,
)

CORPUS = [f"Q: {a}+{b}=? A: {a}+{b}={a + b}. #### {a + b}" for a in range(12) for b in range(12)]

# AdamW with eps=1 is close to SGD with momentum: the update is a smooth function of the gradient,
# so equal gradients give equal weights to ~1e-9. With eps=1e-8 Adam divides each gradient by its
# own size, which turns rounding noise (~1e-8) on near-zero gradients into weight differences of
# up to ~1e-5 at lr=1e-3 (measured): fine for training, useless for a tight equality test.
SGD_LIKE: dict[str, Any] = dict(
    lr=1e-2, eps=1.0, weight_decay=0.01, max_grad_norm=None, warmup_steps=0, total_steps=10
)
ADAM: dict[str, Any] = dict(
    lr=1e-3, weight_decay=0.01, max_grad_norm=1.0, warmup_steps=1, total_steps=10
)

# Decoupled PPO with a k3 KL term against the reference model and an entropy bonus.
PPO_CONFIG = AlgorithmConfig(kl_coef=0.05, entropy_coef=0.01, eps_clip=0.2, behaviour_cap=5.0)


def make_trajectories(
    tokenizer: Any, n: int, *, seed: int = 0, version: int = 0
) -> list[Trajectory]:
    """Arithmetic prompts + answers of varied lengths, with made-up behaviour log-probs."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(12), rng.randrange(12)
        prompt = [tokenizer.bos_token_id] + tokenizer.encode(
            f"Q: {a}+{b}=?", add_special_tokens=False
        )
        answer = tokenizer.encode(f" A: {a}+{b}={a + b}. #### {a + b}", add_special_tokens=False)
        response = answer[: rng.randrange(2, len(answer) + 1)] + [tokenizer.eos_token_id]
        n_p, n_r = len(prompt), len(response)
        out.append(
            Trajectory(
                input_ids=prompt + response,
                loss_mask=[0] * n_p + [1] * n_r,
                logprobs=[0.0] * n_p + [-rng.uniform(0.1, 3.0) for _ in range(n_r)],
                versions=[-1] * n_p + [version] * n_r,
                reward=float(rng.random() < 0.5),
                prompt_len=n_p,
            )
        )
    return out


def make_batch(tokenizer: Any, n: int, *, seed: int = 0) -> TrainBatch:
    return collate(make_trajectories(tokenizer, n, seed=seed), tokenizer.pad_token_id)


def ppo_batch(model_dir: Path, tokenizer: Any, n: int, *, seed: int = 0) -> TrainBatch:
    """A batch with advantages and behaviour log-probs near the model's own (weights ~1)."""
    batch = make_batch(tokenizer, n, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model_lp = token_logprobs(load_model(model_dir), batch.input_ids, batch.attention_mask)
    mask = batch.loss_mask
    noise = 0.1 * torch.randn(mask.shape, generator=gen)
    behaviour = torch.where(mask != 0, model_lp + noise, 0.0)
    advantages = torch.randn(len(batch), 1, generator=gen) * mask
    batch.behaviour_logprobs = behaviour
    return batch.with_fields(advantages=advantages)


def ppo_run(
    model_dir: Path,
    batch: TrainBatch,
    *,
    learner_kw: dict[str, Any],
    micro_batch_tokens: int,
    n_steps: int = 2,
    config: AlgorithmConfig = PPO_CONFIG,
) -> dict[str, Any]:
    """PPO steps on this rank's contiguous share of ``batch`` (a plain process or a rank).

    Proximal log-probs are recomputed before every step, as for a fresh training batch.
    """
    local = shard_rows(batch, get_rank(), get_world_size())
    reference = model_dir if config.kl_coef > 0 else None
    learner = Learner(
        model_dir,
        **learner_kw,
        micro_batch_tokens=micro_batch_tokens,
        reference_model_dir=reference,
    )
    if reference is not None:
        local = local.with_fields(ref_logprobs=learner.compute_reference_logprobs(local))
    loss_fn = PolicyLoss(config)
    stats = []
    for _ in range(n_steps):
        proximal = learner.compute_logprobs(local)
        stats.append(learner.train_step(local.with_fields(proximal_logprobs=proximal), loss_fn))
    return {
        "stats": stats,
        "state": learner.full_state_dict(),
        "rows": len(local),
        "sharded": learner.sharded,
    }


def ppo_runs(
    model_dir: Path, batch: TrainBatch, runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Rank function: several ``ppo_run`` settings in one process (one spawn for all)."""
    return [ppo_run(model_dir, batch, **run) for run in runs]


def critic_run(
    model_dir: Path,
    batch: TrainBatch,
    *,
    learner_kw: dict[str, Any],
    micro_batch_tokens: int,
    n_steps: int = 2,
) -> dict[str, Any]:
    """Value-loss steps of a critic on this rank's contiguous share of ``batch``."""
    local = shard_rows(batch, get_rank(), get_world_size())
    critic = Learner(
        model_dir, **learner_kw, micro_batch_tokens=micro_batch_tokens, with_value_head=True
    )
    values = critic.compute_values(local)
    returns = local.rewards[:, None] * local.loss_mask
    local = local.with_fields(old_values=values, returns=returns)
    stats = [critic.train_step(local, ValueLoss(value_clip=0.2)) for _ in range(n_steps)]
    return {"values": values, "stats": stats, "state": critic.full_state_dict()}


def equivalence_suite(
    model_dir: Path, batch: TrainBatch, runs: list[dict[str, Any]], critic: dict[str, Any]
) -> dict[str, Any]:
    """Rank function: the PPO runs and a critic run in one process (one spawn for all)."""
    return {
        "ppo": ppo_runs(model_dir, batch, runs),
        "critic": critic_run(model_dir, batch, **critic),
    }


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def checkpoint_round_trip(
    model_dir: Path, batch: TrainBatch, url: str, k: int, lora: LoraSpec | None = None
) -> dict[str, Any]:
    """Rank function: k SFT steps, save, one more step; a fresh learner loads and does that step."""
    local = shard_rows(batch, get_rank(), get_world_size())
    first = Learner(model_dir, **ADAM, micro_batch_tokens=48, lora=lora)
    for _ in range(k):
        first.sft_step(local)
    first.version = 3
    first.save_checkpoint(url, extra={"k": k})
    saved = first.full_state_dict()
    expected = first.sft_step(local)
    resumed = Learner(model_dir, **ADAM, micro_batch_tokens=48, lora=lora)
    extra = resumed.load_checkpoint(url)
    counters = (resumed.step, resumed.version)
    got = resumed.sft_step(local)
    return {
        "saved": saved,
        "expected": expected,
        "got": got,
        "want": first.full_state_dict(),
        "have": resumed.full_state_dict(),
        "extra": extra,
        "counters": counters,
    }


def lora_suite(
    model_dir: Path,
    batch: TrainBatch,
    runs: list[dict[str, Any]],
    url: str,
    lora: LoraSpec,
    export_dir: str,
) -> dict[str, Any]:
    """Rank function: LoRA PPO runs (KL against the adapter-free base), a LoRA checkpoint
    round trip and a LoRA export in one process (one spawn for all)."""
    result = {
        "ppo": ppo_runs(model_dir, batch, runs),
        "checkpoint": checkpoint_round_trip(model_dir, batch, url, 2, lora),
    }
    learner = Learner(model_dir, **ADAM, micro_batch_tokens=48, lora=lora)
    learner.sft_step(shard_rows(batch, get_rank(), get_world_size()))
    learner.export_hf(export_dir)
    return result


def collectives_then_fail(fail_rank: int) -> None:
    """Rank function (2 ranks): check the small collectives, then raise on ``fail_rank``."""
    from core.training import all_reduce_max, all_reduce_sum, barrier, is_main

    rank = get_rank()
    assert all_reduce_sum(float(rank + 1)) == 3.0
    assert all_reduce_max(torch.tensor([rank, -rank], dtype=torch.float32)).tolist() == [1.0, 0.0]
    assert is_main() == (rank == 0)
    barrier()
    if rank == fail_rank:
        raise RuntimeError(f"boom on rank {rank}")


def abort_on_rank(abort_rank: int, in_teardown: bool) -> int:
    """Rank function (2 ranks): ``abort_rank`` dies with SIGABRT, in teardown or right now."""
    import os

    import core.training.distributed as distributed

    rank = get_rank()
    if rank == abort_rank:
        if not in_teardown:
            os.abort()
        # _rank_entry calls this after the result is stored and every rank passed the barrier.
        distributed.destroy_distributed = os.abort
    return rank
