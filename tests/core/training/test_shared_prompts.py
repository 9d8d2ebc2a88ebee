"""Shared prompts change no numbers: the same log-probs, entropies, losses, gradients and
weights as the padded forward, with each distinct prompt through the model once -- in a plain
process, under LoRA, and on two FSDP2 ranks (which make the same passes even when a rank shares
nothing or runs a placeholder)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from core.models import load_model
from core.training import collate, shard_rows, spawn_local
from core.training.batch import micro_batch_indices
from core.training.logprobs import entropy_from_logits, logprobs_from_logits
from core.training.shared_prompts import (
    logprobs_from_rows,
    prompt_groups,
    share_prompts,
    shared_logits,
    shared_micro_batch_indices,
)
from tests.core.training.helpers import (
    SGD_LIKE,
    make_trajectories,
    max_abs_diff,
    ppo_run,
    ppo_runs,
)

pytestmark = pytest.mark.unit


def grouped_trajectories(tokenizer, n_prompts: int, group: int, *, seed: int = 0):
    """Arithmetic rows re-dealt as ``group`` samples per prompt, shuffled (groups need not be
    contiguous), every seventh row all prompt."""
    rng = random.Random(seed)
    trajectories = make_trajectories(tokenizer, n_prompts * group, seed=seed)
    prompts = [t.input_ids[: t.prompt_len] for t in trajectories[:n_prompts]]
    for i, t in enumerate(trajectories):
        prompt = prompts[i % n_prompts]
        response = t.input_ids[t.prompt_len :] if i % 7 else []
        t.input_ids = prompt + response
        t.loss_mask = [0] * len(prompt) + [1] * len(response)
        t.logprobs = [0.0] * len(prompt) + t.logprobs[t.prompt_len :][: len(response)]
        t.versions = [-1] * len(prompt) + [0] * len(response)
        t.prompt_len = len(prompt)
    rng.shuffle(trajectories)
    return trajectories


def ppo_collate(tokenizer, trajectories, *, seed: int = 0):
    """The trajectories as a batch with behaviour log-probs and advantages for PPO."""
    batch = collate(trajectories, tokenizer.pad_token_id)
    batch.behaviour_logprobs = torch.where(batch.loss_mask != 0, -0.5 * batch.loss_mask, 0.0)
    gen = torch.Generator().manual_seed(seed)
    advantages = torch.randn(len(batch), 1, generator=gen) * batch.loss_mask
    return batch.with_fields(advantages=advantages)


def grouped_batch(tokenizer, n_prompts: int, group: int, *, seed: int = 0):
    trajectories = grouped_trajectories(tokenizer, n_prompts, group, seed=seed)
    return ppo_collate(tokenizer, trajectories, seed=seed)


def test_the_layout_holds_each_prompt_once_and_every_token_in_place(model_dir, tokenizer) -> None:
    batch = grouped_batch(tokenizer, 3, 4)
    layout = share_prompts(batch.input_ids, batch.attention_mask, batch.prompt_lens)
    assert layout.n_prompts == 3 == len(prompt_groups(batch.input_ids, batch.prompt_lens))
    # Token ids read back through ``source`` from the [prompts; suffixes] table are the rows.
    table_ids = torch.cat([layout.prompt_ids.flatten(), layout.suffix_ids.flatten()])
    assert torch.equal(table_ids[layout.source] * batch.attention_mask, batch.input_ids)
    assert int(layout.suffix_mask.sum()) == int((batch.seq_lens - batch.prompt_lens).sum())


def test_shared_forward_matches_the_padded_one(model_dir, tokenizer) -> None:
    batch = grouped_batch(tokenizer, 3, 4, seed=1)
    model = load_model(model_dir)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   use_cache=False).logits  # fmt: skip
    lp = logprobs_from_logits(logits, batch.input_ids, batch.attention_mask, 0.7)
    ent = entropy_from_logits(logits, batch.attention_mask, 0.7)
    layout = share_prompts(batch.input_ids, batch.attention_mask, batch.prompt_lens)
    table = shared_logits(model, layout)
    assert table.shape[0] < batch.input_ids.numel()  # fewer positions through the model
    shared_lp, shared_ent = logprobs_from_rows(
        table, layout.source, batch.input_ids, batch.attention_mask, 0.7, entropy=True
    )
    torch.testing.assert_close(shared_lp, lp, atol=2e-5, rtol=0)
    torch.testing.assert_close(shared_ent, ent, atol=2e-5, rtol=0)
    # Gradients through the shared cache equal the padded ones.
    weights = batch.loss_mask * torch.linspace(-1, 1, batch.width)
    (lp * weights).sum().backward()
    padded_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (shared_lp * weights).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, padded_grads[name], atol=1e-5, rtol=1e-4)


def test_micro_batches_keep_groups_whole_and_cost_no_more_than_padding(model_dir, tokenizer):
    batch = grouped_batch(tokenizer, 6, 4, seed=2)
    groups = {tuple(g) for g in prompt_groups(batch.input_ids, batch.prompt_lens)}
    for budget in (40, 120, 400, 10_000):
        micros = shared_micro_batch_indices(batch, budget)
        rows = torch.cat(micros).sort().values
        assert torch.equal(rows, torch.arange(len(batch)))  # every row exactly once
        if budget >= 400:  # a group fits: none is cut
            for g in groups:
                assert sum(any(r in m.tolist() for r in g) for m in micros) == 1
        for m in micros:
            sub = batch.select(m).trim()
            layout = share_prompts(sub.input_ids, sub.attention_mask, sub.prompt_lens)
            cost = layout.prompt_ids.numel() + layout.suffix_ids.numel()
            assert len(m) == 1 or cost <= budget
            if layout.n_prompts == len(m):  # shares nothing: the padded fallback fits too
                assert len(m) == 1 or len(m) * sub.width <= budget
        if budget == 10_000:
            assert len(micros) == 1 < len(micro_batch_indices(batch, 150))


def _runs(model_dir, batch, extra: dict[str, Any]) -> tuple[dict, dict]:
    padded = ppo_run(model_dir, batch, learner_kw={**SGD_LIKE, **extra}, micro_batch_tokens=10_000)
    shared = ppo_run(model_dir, batch, learner_kw={**SGD_LIKE, **extra, "share_prompts": True},
                     micro_batch_tokens=10_000)  # fmt: skip
    return padded, shared


def _assert_same_training(padded: dict, shared: dict, weight_atol: float = 1e-5) -> None:
    for a, b in zip(padded["stats"], shared["stats"], strict=True):
        for key in ("loss", "policy_loss", "grad_norm", "kl", "entropy", "tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    assert max_abs_diff(padded["state"], shared["state"]) <= weight_atol


def test_shared_learner_steps_equal_padded_ones(model_dir, tokenizer) -> None:
    """Two PPO steps (proximal and reference passes, KL, entropy): same statistics, weights."""
    batch = grouped_batch(tokenizer, 4, 4, seed=3)
    _assert_same_training(*_runs(model_dir, batch, {}))


def test_shared_lora_steps_equal_padded_ones(model_dir, tokenizer) -> None:
    from core.training import LoraSpec

    batch = grouped_batch(tokenizer, 3, 4, seed=4)
    lora = {"lora": LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))}
    _assert_same_training(*_runs(model_dir, batch, lora))


def test_two_sharded_ranks_with_shared_prompts_match_one_padded_process(model_dir, tokenizer):
    """Rank 0 holds groups, rank 1 rows that share nothing and, with a tight budget, fewer
    micro-batches (placeholder passes): every rank still makes the same FSDP passes."""
    grouped = grouped_trajectories(tokenizer, 2, 4, seed=5)
    singles = make_trajectories(tokenizer, 8, seed=6)
    batch = ppo_collate(tokenizer, grouped + singles, seed=5)

    def counts(budget: int) -> list[int]:
        halves = (shard_rows(batch, rank, 2) for rank in range(2))
        return [len(shared_micro_batch_indices(half, budget)) for half in halves]

    budget = next(b for b in range(30, 400) if counts(b)[0] != counts(b)[1])
    run = dict(learner_kw={**SGD_LIKE, "share_prompts": True}, micro_batch_tokens=budget)
    ranks = spawn_local(ppo_runs, 2, model_dir, batch, [run])
    single = ppo_run(model_dir, batch, learner_kw=SGD_LIKE, micro_batch_tokens=10_000)
    two = ranks[0][0]
    assert two["sharded"] and two["stats"][0]["micro_batches"] == max(counts(budget))
    for a, b in zip(single["stats"], two["stats"], strict=True):
        for key in ("loss", "policy_loss", "kl", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-9), key
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert max_abs_diff(single["state"], two["state"]) <= 1e-6


def test_models_whose_cache_is_not_a_plain_prefix_do_not_share(model_dir) -> None:
    from types import SimpleNamespace

    from core.training import Learner
    from core.training.shared_prompts import sharing_unsupported

    assert sharing_unsupported(load_model(model_dir).config) is None
    sliding = SimpleNamespace(layer_types=["full_attention", "sliding_attention"])
    assert "sliding_attention" in sharing_unsupported(sliding)
    assert sharing_unsupported(SimpleNamespace()) is None  # no layer_types: full attention
    # without layer_types, layers are inferred as transformers does (Mistral, Qwen2, Llama 4)
    assert "sliding window of 4096" in sharing_unsupported(SimpleNamespace(sliding_window=4096))
    qwen2 = SimpleNamespace(sliding_window=4096, use_sliding_window=False)
    assert sharing_unsupported(qwen2) is None
    assert "chunks" in sharing_unsupported(SimpleNamespace(attention_chunk_size=8192))
    learner = Learner(model_dir, **SGD_LIKE, micro_batch_tokens=100, share_prompts=True)
    assert learner.prompt_sharing
    critic = Learner(model_dir, **SGD_LIKE, micro_batch_tokens=100, share_prompts=True,
                     with_value_head=True)  # fmt: skip
    assert not critic.prompt_sharing  # a critic stays padded


def test_the_cache_argument_follows_the_transformers_version() -> None:
    from core.training.shared_prompts import cache_kwarg

    class Before(torch.nn.Module):  # transformers < 5.2x
        def forward(self, input_ids, past_key_values=None, use_cache=None): ...

    class After(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=None): ...

    class Peft(torch.nn.Module):  # a peft model forwards **kwargs to its base model
        def __init__(self, base):
            super().__init__()
            self.base = base

        def get_base_model(self):
            return self.base

        def forward(self, *args, **kwargs): ...

    assert cache_kwarg(Before()) == "past_key_values" == cache_kwarg(Peft(Before()))
    assert cache_kwarg(After()) == "cache" == cache_kwarg(Peft(After()))
