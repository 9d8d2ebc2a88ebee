"""One learner rank: the policy (and, for PPO presets, the critic and a frozen reference).

With ``model.lora_rank`` > 0 the RL and DPO policies train LoRA adapters (core/training/lora.py);
the SFT warm start and the critic train all their weights. ``mode`` picks the work: ``rl``,
``sft``, ``dpo`` (the policy against a frozen reference, its starting weights) or
``reward_model`` (a value model trained on pairs).

The driver sends every rank the whole batch; each rank trains on its share of whole groups
(``shard_rows``), so FSDP2's data parallelism sees the same global batch however many ranks run.
Every method here is collective: the driver calls it on all ranks at once.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import torch

from core.algorithms import AlgorithmConfig
from core.config import Config
from core.inference.weight_broadcast import (
    broadcast_tensors,
    close_group,
    open_group,
    tensor_metadata,
)
from core.models.value_model import last_token_values
from core.storage import fetch_dir
from core.training import (
    Learner,
    LoraSpec,
    PolicyLoss,
    SFTLoss,
    TrainBatch,
    ValueLoss,
    barrier,
    init_distributed,
    is_main,
    shard_rows,
)
from core.training.losses import DPOLoss, RewardModelLoss, proximal_plan
from core.training.mismatch import MismatchMonitor

logger = logging.getLogger(__name__)


class LearnerWorker:
    """Policy learner (+ critic/reference when the algorithm needs them) on one rank."""

    def __init__(self, config: Config, model_dir: str, *, mode: str = "rl") -> None:
        torch.set_num_threads(max(1, config.scheduler.torch_threads))
        model_dir = fetch_dir(model_dir)  # a URL on a node without the driver's disk
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if self.world_size > 1:
            init_distributed()
        self.rank = int(os.environ.get("RANK", "0"))
        self.config = config
        self.algo: AlgorithmConfig = config.algorithm
        a = config.algorithm
        common = dict(
            micro_batch_tokens=config.learner.micro_batch_tokens,
            pack_sequences=config.learner.pack_sequences,
            # SFT rows rarely repeat a prompt; RL groups always do.
            share_prompts=config.learner.share_prompts and mode == "rl",
            dtype=config.model.dtype,
            attn_implementation=config.model.attn_implementation,
            seed=config.experiment.seed,
            temperature=config.sampling.temperature,
        )
        # The stages before RL: one learner with its section's optimiser settings.
        stages: dict[str, tuple[Any, dict[str, Any]]] = {
            "sft": (config.sft, {"betas": (0.9, 0.98)}),
            # DPO's reference is the starting model (with LoRA: the frozen base).
            "dpo": (config.dpo, {"reference_model_dir": model_dir, "lora": _lora_spec(config)}),
            # The warm start's backbone with a fresh scalar head.
            "reward_model": (config.reward_model, {"with_value_head": True}),
        }
        if mode in stages:
            section, extra = stages[mode]
            self.policy = Learner(
                model_dir,
                lr=section.lr,
                weight_decay=section.weight_decay,
                max_grad_norm=section.max_grad_norm,
                warmup_steps=section.warmup_steps,
                total_steps=max(1, section.steps),
                min_lr_ratio=section.min_lr_ratio,
                **extra,
                **common,
            )
            self.critic = None
            return
        steps = config.learner.total_steps * a.ppo_n_minibatches
        reference = model_dir if a.kl_coef > 0 or a.kl_in_reward_coef > 0 else None
        self.policy = Learner(
            model_dir,
            lr=a.lr,
            weight_decay=a.weight_decay,
            max_grad_norm=a.max_grad_norm,
            warmup_steps=0,
            total_steps=max(1, steps),
            min_lr_ratio=1.0,
            reference_model_dir=reference,
            lora=_lora_spec(config),
            **common,
        )
        self.critic = (
            Learner(config.critic.path or model_dir, with_value_head=True, lr=a.critic_lr,
                    weight_decay=a.weight_decay, max_grad_norm=a.max_grad_norm, warmup_steps=0,
                    total_steps=max(1, steps), min_lr_ratio=1.0, **common)
            if a.use_critic else None
        )  # fmt: skip

    # ------------------------------------------------------------------ per-step work
    def _shard(self, batch: TrainBatch, group_size: int | None = None) -> TrainBatch:
        size = self.algo.group_size if group_size is None else group_size
        return shard_rows(batch, self.rank, self.world_size, group_size=size)

    def _gather_rows(self, shard_values: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        """Every rank's ``[n_r, T_r]`` shard output, reassembled to the batch's ``[N, T]``."""
        if self.world_size == 1:
            return _pad_to(shard_values, batch.width)
        gathered: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, shard_values)
        return torch.cat([_pad_to(g, batch.width) for g in gathered])

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values ``[N, T]`` for the whole batch (for GAE on the driver)."""
        assert self.critic is not None, "compute_values needs algorithm.use_critic"
        return self._gather_rows(self.critic.compute_values(self._shard(batch)), batch)

    def compute_ref_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Reference-policy log-probs ``[N, T]`` for the whole batch (KL in the reward)."""
        return self._gather_rows(self.policy.compute_reference_logprobs(self._shard(batch)), batch)

    def rl_update(self, batch: TrainBatch) -> dict[str, float]:
        """Proximal/reference log-probs, ``ppo_n_minibatches`` policy steps, critic steps; version + 1."""
        a = self.algo
        shard = self._shard(batch)
        extra: dict[str, torch.Tensor] = {}
        plan = proximal_plan(a, has_dropout=_has_dropout(self.policy.model))
        if plan.recompute:
            extra["proximal_logprobs"] = self.policy.compute_logprobs(shard)
        if a.kl_coef > 0:
            extra["ref_logprobs"] = self.policy.compute_reference_logprobs(shard)
        shard = shard.with_fields(**extra)
        monitor = (
            MismatchMonitor(self.policy.version, self.config.learner.mismatch_tolerance)
            if plan.exact_logprobs
            else None
        )
        loss = PolicyLoss(
            a,
            proximal_version=self.policy.version,
            proximal_is_current=plan.from_training_pass,
            mismatch=monitor,
        )
        steps = self.policy.update(
            shard, loss, n_minibatches=a.ppo_n_minibatches, group_size=a.group_size
        )
        stats = _mean_stats(steps, prefix="actor/")
        if monitor is not None:
            stats.update(self._mismatch_stats(monitor))
        if self.critic is not None:
            critic_loss = ValueLoss(
                value_clip=a.value_clip,
                aggregation=a.loss_aggregation,
                norm_constant=a.loss_norm_constant,
            )
            critic_steps = self.critic.update(
                shard, critic_loss, n_minibatches=a.ppo_n_minibatches, group_size=a.group_size
            )
            stats.update(_mean_stats(critic_steps, prefix="critic/"))
        stats["version"] = float(self.policy.version)
        return stats

    def _mismatch_stats(self, monitor: MismatchMonitor) -> dict[str, float]:
        """The update's ``mismatch/…`` metrics over every rank, and where the worst token was
        (``mismatch/worst_*``: its row in the driver's batch, position, log-probs, version)."""
        if self.world_size > 1:
            monitors: list[Any] = [None] * self.world_size
            torch.distributed.all_gather_object(monitors, monitor)
            monitor = monitors[0]
            for other in monitors[1:]:
                monitor.merge(other)
        summary = monitor.summary()
        worst = summary.pop("worst")
        summary.update({f"mismatch/worst_{k}": float(v) for k, v in vars(worst).items()})
        return summary

    def sft_step(self, batch: TrainBatch) -> dict[str, float]:
        return self.policy.train_step(self._shard(batch, group_size=1), SFTLoss())

    def dpo_step(self, batch: TrainBatch) -> dict[str, float]:
        """One DPO step on rows in (chosen, rejected) pairs; the reference's log-probs first."""
        shard = self._shard(batch, group_size=2)
        shard = shard.with_fields(ref_logprobs=self.policy.compute_reference_logprobs(shard))
        d = self.config.dpo
        loss = DPOLoss(beta=d.beta, kind=d.loss, nll_coef=d.nll_coef)
        return self.policy.train_step(shard, loss)

    def sequence_logprobs(self, batch: TrainBatch, reference: bool = False) -> torch.Tensor:
        """``[N]`` log-probability of each row's loss tokens (its answer) under the current
        policy, or the frozen reference; no grad, rows in pairs."""
        shard = self._shard(batch, group_size=2)
        compute = (
            self.policy.compute_reference_logprobs if reference else self.policy.compute_logprobs
        )
        sums = (compute(shard) * shard.loss_mask).sum(-1, keepdim=True)
        return self._gather_rows(sums, batch)[:, 0]

    def reward_model_step(self, batch: TrainBatch) -> dict[str, float]:
        """One Bradley–Terry step on rows in (chosen, rejected) pairs (mode ``reward_model``)."""
        return self.policy.train_step(self._shard(batch, group_size=2), RewardModelLoss())

    def sequence_rewards(self, batch: TrainBatch) -> torch.Tensor:
        """``[N]`` reward of each row (mode ``reward_model``): its value at its last token."""
        shard = self._shard(batch, group_size=2)
        rewards = last_token_values(self.policy.compute_values(shard), shard.attention_mask)
        return self._gather_rows(rewards[:, None], batch)[:, 0]

    # ------------------------------------------------------------------ weights and state
    def export(self, directory: str) -> str:
        """HF folder of the current policy (rank 0 writes; collective)."""
        self.policy.export_hf(directory)
        barrier()
        return directory

    # Weights by broadcast (inference.weight_sync=distributed): rank 0 is rank 0 of a group with
    # the inference servers; the other learner ranks only take part in gathering the state.
    def open_weight_group(
        self, master_address: str, master_port: int, world_size: int, name: str, backend: str
    ) -> None:
        """Rank 0 joins the servers' weight group (returns once they all have)."""
        if is_main():
            self._weight_group = open_group(
                master_address, master_port, 0, world_size, name, backend
            )

    def weight_metadata(self) -> dict[str, list]:
        """``names``/``dtypes``/``shapes`` of what :meth:`broadcast_weights` sends (collective)."""
        return tensor_metadata(self.policy.serving_state_dict())

    def broadcast_weights(self) -> None:
        """The current policy to every server in the weight group (collective)."""
        state = self.policy.serving_state_dict()
        if is_main():
            broadcast_tensors(self._weight_group, state.values())
        barrier()

    def close_weight_group(self) -> None:
        group = getattr(self, "_weight_group", None)
        if group is not None:
            close_group(group)

    def save_checkpoint(self, url: str) -> None:
        self.policy.save_checkpoint(f"{url}/policy")
        if self.critic is not None:
            self.critic.save_checkpoint(f"{url}/critic")

    def load_checkpoint(self, url: str) -> int:
        self.policy.load_checkpoint(f"{url}/policy")
        if self.critic is not None:
            self.critic.load_checkpoint(f"{url}/critic")
        return self.policy.version

    def version(self) -> int:
        """The policy's version: how many updates it has taken."""
        return self.policy.version

    def node_address(self) -> str:
        """An address of this rank's node the servers can reach (loopback outside Ray)."""
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"

    def node_id(self) -> str:
        """The Ray node this rank runs on (the host name outside Ray)."""
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
        return socket.gethostname()

    def is_main(self) -> bool:
        return is_main()

    def close(self) -> None:
        self.close_weight_group()
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _lora_spec(config: Config) -> LoraSpec | None:
    m = config.model
    if m.lora_rank == 0:
        return None
    return LoraSpec(m.lora_rank, m.lora_alpha, tuple(m.lora_target_modules), m.lora_dropout)


def _has_dropout(model: torch.nn.Module) -> bool:
    """Whether a training-mode forward pass is random (dropout modules or config rates > 0)."""
    config = getattr(model, "config", None)
    rates = [
        getattr(config, key, 0.0) or 0.0
        for key in ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop")
    ]
    modules = (m.p for m in model.modules() if isinstance(m, torch.nn.Dropout))
    return any(float(r) > 0 for r in rates) or any(p > 0 for p in modules)


def _pad_to(values: torch.Tensor, width: int) -> torch.Tensor:
    if values.shape[1] >= width:
        return values[:, :width]
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def _mean_stats(steps: list[dict[str, float]], prefix: str) -> dict[str, float]:
    keys = steps[0].keys()
    out = {f"{prefix}{k}": sum(s[k] for s in steps) / len(steps) for k in keys}
    out[f"{prefix}seconds"] = sum(s["seconds"] for s in steps)
    return out


def export_path(root: str | Path, version: int) -> str:
    return str(Path(root) / f"v{version:06d}")
