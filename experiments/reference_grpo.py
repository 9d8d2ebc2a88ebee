"""Synchronous GRPO in one process, top to bottom: what the platform does, with no machinery.

    python experiments/reference_grpo.py [--steps 3] [--model runs/quickstart/<trial>/sft] [k=v ...]

Without ``--model`` it starts from nothing, as the quickstart does: its synthetic problems, a
tiny Qwen2 and byte-level BPE tokenizer built here, and the SFT warm start (``sft.steps``, 600 by
default: about 5 minutes on 2 CPU cores; ``sft.steps=100`` for a quick look).

Each step: draw B prompts → sample G completions of each → score them → group-normalised
advantages (GRPO, DeepSeekMath arXiv 2402.03300) → one clipped policy-gradient step (PPO,
arXiv 1707.06347, in AReaL's decoupled form, arXiv 2505.24298). It is the platform at η = 0
(`asyncrl run CONFIG rollout.max_staleness=0`) without a rollout process, a staleness bound,
FSDP, weight publishing or checkpoints — built from the same functions (`core.algorithms`,
`core.training.logprobs`, `core.inference.engine.sampling`). With the same config and seed it draws the
same prompts, samples the same tokens and gives the Trainer's losses
(tests/experiments/test_reference_grpo.py); ``core/runtime/trainer.py`` is the same step in the
same four phases, with the machinery.

Left out, as the quickstart's GRPO leaves them out: the KL term (kl_coef = 0), a critic, several
minibatches per step (ppo_n_minibatches = 1), dynamic sampling, reward shaping.
"""

from __future__ import annotations

import inspect
import sys

import torch
from transformers import DynamicCache

from core.algorithms import global_normalizer, ppo_policy_loss
from core.config import Config, load_config
from core.data.dataloader import ResumableDataLoader
from core.data.prompting import Prompter
from core.inference.engine.sampling import gumbel_, seeded_uniforms, split_seed
from core.models import load_model, load_tokenizer
from core.rewards.registry import SafeReward, resolve_reward
from core.rollout.api import derive_seed
from core.runtime.advantages import with_advantages
from core.runtime.metrics import MemorySink
from core.runtime.sft import sft_warm_start
from core.runtime.stages import PreparedData, build_or_load_model, prepare_data
from core.training.batch import TrainBatch
from core.training.logprobs import token_logprobs


@torch.no_grad()
def sample_group(policy, prompt: list[int], seeds: list[int], cfg: Config, eos_id: int):
    """``len(seeds)`` completions of ``prompt``: (tokens, behaviour log-probs) per completion.

    Token ``t`` is ``argmax(logits / T + Gumbel noise)``, a sample of ``softmax(logits / T)``
    (the Gumbel-max trick); the noise is keyed on (seed, sequence position) exactly as in our
    engine, so a seed fixes a completion however requests are batched.
    """
    n, temperature = len(seeds), cfg.sampling.temperature
    keys = torch.tensor([split_seed(seed) for seed in seeds])
    cache, inputs = DynamicCache(config=policy.config), torch.tensor([prompt] * n)
    # transformers 5.2x renamed the KV-cache argument; earlier releases call it past_key_values
    kwarg = (
        "cache" if "cache" in inspect.signature(policy.forward).parameters else "past_key_values"
    )
    tokens: list[list[int]] = [[] for _ in seeds]
    logprobs: list[list[float]] = [[] for _ in seeds]
    for step in range(cfg.sampling.max_new_tokens):
        logits = policy(input_ids=inputs, use_cache=True, **{kwarg: cache}).logits[:, -1]
        scaled = logits.float() / temperature
        position = torch.full((n,), len(prompt) + step)  # the noise's key: sequence length
        noise = gumbel_(seeded_uniforms(keys, position, scaled.shape[-1]))
        chosen = (scaled.double() + noise).argmax(dim=-1)
        picked = torch.log_softmax(scaled, dim=-1).gather(1, chosen[:, None]).squeeze(1)
        for row, (token, logprob) in enumerate(zip(chosen.tolist(), picked.tolist(), strict=True)):
            if not tokens[row] or tokens[row][-1] != eos_id:  # a finished row stays finished
                tokens[row].append(token)
                logprobs[row].append(logprob)
        if all(row and row[-1] == eos_id for row in tokens):
            break
        inputs = chosen[:, None]
    return tokens, logprobs


def train(cfg: Config, model_dir: str, train_rows: list[dict], steps: int):
    """``steps`` GRPO steps on the model in ``model_dir``; returns each step's numbers and the
    trained policy."""
    algo, B, G = cfg.algorithm, cfg.rollout.batch_size, cfg.algorithm.group_size
    assert algo.adv_estimator == "grpo" and algo.kl_coef == 0 and algo.ppo_n_minibatches == 1
    assert algo.policy_loss == "ppo", "the reference loop is GRPO with PPO's clipped loss"
    tokenizer, policy = load_tokenizer(model_dir), load_model(model_dir, dtype="float32")
    reward = SafeReward(resolve_reward(cfg.rollout.reward_fn))
    # AdamW without weight decay on biases and norms (1-D tensors), at a constant learning rate.
    params = (
        [p for p in policy.parameters() if p.ndim >= 2],
        [p for p in policy.parameters() if p.ndim < 2],
    )
    groups = [
        {"params": params[0], "weight_decay": algo.weight_decay},
        {"params": params[1], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=algo.lr)
    # Prompts in the rollout worker's order; a draw's place in the stream seeds its sampling.
    loader = ResumableDataLoader(train_rows, batch_size=1, shuffle=True, seed=cfg.experiment.seed)
    prompter = Prompter.from_config(cfg, tokenizer)
    history = []
    for step in range(steps):
        # 1. Rollout: B prompts × G completions from the current weights (η = 0: nothing stale).
        rows, rewards, behaviour, sample_ids = [], [], [], []
        for _ in range(B):
            drawn = loader.state_dict()
            sample = loader.next_samples(1)[0]
            sample_ids.append(str(sample["id"]))
            prompt_seed = derive_seed(cfg.experiment.seed, drawn["epoch"], drawn["position"])
            prompt = prompter.prompt_ids(sample["question"])  # the platform's one prompt path
            seeds = [derive_seed(prompt_seed, i) for i in range(G)]  # one per episode of the group
            policy.eval()
            completions, logprobs = sample_group(policy, prompt, seeds, cfg, tokenizer.eos_token_id)
            for tokens, token_logprobs_ in zip(completions, logprobs, strict=True):
                text = tokenizer.decode(tokens, skip_special_tokens=True)
                rows.append((prompt, tokens))
                rewards.append(reward(text, sample["answer"]))  # 1 if the final answer is right
                behaviour.append(token_logprobs_)
        # 2. Batch: prompt + completion per row, right-padded; the loss sees completion tokens only.
        width = max(len(p) + len(c) for p, c in rows)
        input_ids = torch.full((B * G, width), tokenizer.pad_token_id)
        loss_mask, behav = torch.zeros(B * G, width), torch.zeros(B * G, width)
        for i, ((prompt, tokens), logprobs) in enumerate(zip(rows, behaviour, strict=True)):
            n_prompt, n = len(prompt), len(prompt) + len(tokens)
            input_ids[i, :n] = torch.tensor(prompt + tokens)
            loss_mask[i, n_prompt:n] = 1.0
            behav[i, n_prompt:n] = torch.tensor(logprobs)
        attention_mask = (
            torch.arange(width)[None, :] < torch.tensor([len(p) + len(c) for p, c in rows])[:, None]
        ).long()
        # 3. Advantages: each reward against its own group, A = (r − mean) / (std + ε), given to
        # every completion token; the platform's entry point, as the Trainer calls it.
        scores = torch.tensor(rewards)
        batch = TrainBatch(
            input_ids, attention_mask, loss_mask, behav, versions=torch.zeros_like(input_ids),
            rewards=scores, prompt_lens=torch.tensor([len(p) for p, _ in rows]),
        )  # fmt: skip
        max_new = cfg.sampling.max_new_tokens
        advantages = with_advantages(batch, algo, max_new_tokens=max_new)["advantages"]
        # 4. Policy step. π_prox, the weights before this step, is the training pass itself
        # (one optimiser step per batch); the behaviour weight π_prox/π_behav is ≈ 1 at η = 0.
        policy.train()
        logprobs = token_logprobs(policy, input_ids, attention_mask, cfg.sampling.temperature)
        loss, stats = ppo_policy_loss(
            logprobs, logprobs.detach(), advantages, loss_mask, behaviour_logprobs=behav,
            eps_clip=algo.eps_clip, eps_clip_high=algo.eps_clip_high, dual_clip=algo.dual_clip,
            behaviour_cap=algo.behaviour_cap, behaviour_mask_mode=algo.behaviour_mask_mode,
            behaviour_level=algo.behaviour_level, behaviour_cap_low=algo.behaviour_cap_low,
            behaviour_veto=algo.behaviour_veto, aggregation=algo.loss_aggregation, normalizer=global_normalizer(loss_mask, algo.loss_aggregation),
        )  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), algo.max_grad_norm)
        optimizer.step()
        numbers = {
            "loss": loss.item(),
            "reward": scores.mean().item(),
            "grad_norm": grad_norm.item(),
        }
        history.append({"step": step, "sample_ids": sample_ids, **numbers, "clip_frac": stats["clip_frac"].item()})  # fmt: skip
        print(f"step {step}: reward {history[-1]['reward']:.3f}, loss {history[-1]['loss']:+.5f}")
    return history, policy


def warm_start(cfg: Config, data: PreparedData) -> str:
    """The quickstart's starting point, made from nothing: the tiny model and its tokenizer
    (trained on the problems' text), then ``sft.steps`` of supervised fine-tuning."""
    model_dir = build_or_load_model(cfg, data)
    return str(sft_warm_start(cfg, model_dir, data.train, MemorySink()))


if __name__ == "__main__":
    args = sys.argv[1:]
    n_steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 3
    overrides = [a for a in args if "=" in a]
    config = load_config("experiments/quickstart.yaml", ["rollout.max_staleness=0", *overrides])
    data = prepare_data(config)
    model = args[args.index("--model") + 1] if "--model" in args else warm_start(config, data)
    train(config, model, data.train, n_steps)
