"""The learner: one per process (rank), owning a policy (or critic) and its optimiser.

Placement
    Without ``torch.distributed`` initialised the learner is a plain single-process trainer.
    With a process group (gloo on CPU, NCCL on GPUs; ``init_distributed``) the model is wrapped
    with FSDP2 (one unit per decoder layer + the root) even at world size 1, and every method
    below is *collective*: all ranks must call it, each with its own rows of the global batch.
    The device is ``cuda:LOCAL_RANK`` when a GPU is visible, else the CPU.

Normaliser and gradient averaging (how one step equals the unsplit batch)
    ``train_step`` asks the loss for this rank's normaliser ``D_r`` over all its micro-batches,
    SUM-all-reduces it to the global ``D``, and calls the loss per micro-batch with ``D``: the
    sum of all micro-batch losses over all ranks is then exactly the loss of the whole global
    batch. Gradients accumulate over micro-batches (a sum). FSDP2 *averages* gradients over the
    R ranks, so each backward is scaled by R, which restores the sum; the reported ``loss`` is
    the SUM-all-reduced loss. (Multiplying by R = 2^k is exact in floating point.) Ranks may
    hold different numbers of micro-batches; the short ones run zero-weight placeholder passes
    so that FSDP's collectives stay in step.

LoRA
    With ``lora`` the policy is wrapped with peft adapters before sharding and only they train
    (see lora.py): the KL reference is the same model with its adapters disabled, weight
    exports hold the merged weights under the base model's names (plus the adapter in
    ``adapter/``), and checkpoints hold the adapters and their optimiser state, the frozen base
    being re-read from ``model_dir`` (recorded in the checkpoint and checked on load).

Versions
    ``step`` counts optimiser updates (it drives the LR schedule). ``version`` is the weight
    version the async loop stamps on generated tokens; AReaL bumps it once per *training batch*
    (``ppo_n_minibatches`` optimiser steps), so ``train_step`` leaves it alone and ``update``
    (split into minibatches, one step each) adds 1. Both are saved in checkpoints.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

import core.training.checkpoint as checkpoint
from core.models import load_model, torch_dtype
from core.models.value_model import ValueModel, save_value_head, split_state
from core.training.batch import (
    TrainBatch,
    micro_batch_indices,
    scatter_rows,
    split_minibatches,
)
from core.training.distributed import all_reduce_max, all_reduce_sum, dist_info, is_initialized
from core.training.logprobs import effective_temperature, entropy_from_logits, logprobs_from_logits
from core.training.lora import (
    LoraSpec,
    apply_lora,
    lora_mismatch,
    lora_scalings,
    merged_state_dict,
    save_adapter,
)
from core.training.losses import LossFn, SFTLoss
from core.training.lr_schedule import warmup_cosine_schedule
from core.training.packing import packed_logits
from core.training.sharding import shard_model
from core.training.shared_prompts import (
    logprobs_from_rows,
    share_prompts,
    shared_logits,
    shared_micro_batch_indices,
    sharing_unsupported,
)
from core.training.stats import StatsAccumulator

logger = logging.getLogger(__name__)

Tensor = torch.Tensor
Forward = Callable[[nn.Module, TrainBatch], Tensor]


class Learner:
    """Policy or critic trainer for one rank (see the module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        lr: float,
        weight_decay: float,
        max_grad_norm: float | None,
        warmup_steps: int,
        total_steps: int,
        min_lr_ratio: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        micro_batch_tokens: int,
        pack_sequences: bool = False,
        share_prompts: bool = False,
        temperature: float = 1.0,
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        seed: int = 0,
        with_value_head: bool = False,
        reference_model_dir: str | Path | None = None,
        lora: LoraSpec | None = None,
    ) -> None:
        if with_value_head and reference_model_dir is not None:
            raise ValueError("a critic (with_value_head=True) takes no reference_model_dir")
        if with_value_head and lora is not None:
            raise ValueError("a critic (with_value_head=True) trains all its weights: no lora")
        self.model_dir = Path(model_dir)
        self.device = dist_info().device
        self.sharded = is_initialized()
        # FSDP2 averages gradients over this many ranks; train_step compensates.
        self.world_size = dist_info().world_size
        self.compute_dtype = torch_dtype(dtype)
        self.micro_batch_tokens = micro_batch_tokens
        self.pack_sequences = pack_sequences
        # Packing has no per-row cache and a critic reads hidden states: both keep their paths.
        self.prompt_sharing = share_prompts and not pack_sequences and not with_value_head
        self.temperature = effective_temperature(temperature)
        self.max_grad_norm = max_grad_norm
        self.with_value_head = with_value_head
        self.lora = lora
        self.step = 0
        self.version = 0

        # Master weights are float32 whatever the compute dtype (see sharding.py). ``seed`` only
        # initialises the value head or the LoRA adapters (nothing else here is random); no
        # global RNG is touched.
        attention = {"attn_implementation": attn_implementation}
        if with_value_head:
            model: nn.Module = ValueModel.from_pretrained(model_dir, seed=seed, **attention)
        else:
            model = load_model(model_dir, dtype="float32", **attention)
        if lora is not None:
            model = apply_lora(model, lora, seed=seed)
        self._scalings = lora_scalings(model)
        self.model = self._place(model)
        self.reference: nn.Module | None = None
        # With LoRA the frozen base *is* the initial policy: the reference costs no memory.
        self._reference_is_base = (
            lora is not None
            and reference_model_dir is not None
            and Path(reference_model_dir) == self.model_dir
        )
        if reference_model_dir is not None and not self._reference_is_base:
            reference = load_model(reference_model_dir, dtype="float32", **attention)
            reference.requires_grad_(False)
            self.reference = self._place(reference)
        configs = [(model_dir, model.config)]
        if self.reference is not None:
            configs.append((reference_model_dir, self.reference.config))
        for name, config in configs:
            if self.prompt_sharing and (why := sharing_unsupported(config)):
                logger.warning("share_prompts is off: %s cannot share prompts: %s", name, why)
                self.prompt_sharing = False

        self.optimizer = torch.optim.AdamW(
            _param_groups(self.model, weight_decay), lr=lr, betas=betas, eps=eps
        )
        self.scheduler = warmup_cosine_schedule(
            self.optimizer,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            min_lr_ratio=min_lr_ratio,
        )
        logger.info(
            "learner ready: %s%s on %s, world size %d, %.2f M parameters (%.2f M trainable%s)",
            "value model of " if with_value_head else "",
            model_dir,
            self.device,
            self.world_size,
            sum(p.numel() for p in self.model.parameters()) / 1e6,
            sum(p.numel() for p in self.model.parameters() if p.requires_grad) / 1e6,
            f", LoRA rank {lora.rank}" if lora is not None else "",
        )

    # --- placement --------------------------------------------------------------------------
    def _place(self, model: nn.Module) -> nn.Module:
        if self.sharded:
            return shard_model(model, self.device, param_dtype=self.compute_dtype)
        return model.to(self.device)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        # FSDP2's MixedPrecisionPolicy already computes in the low dtype when sharded.
        if self.sharded or self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    # --- forward passes ---------------------------------------------------------------------
    def _logits(self, model: nn.Module, micro: TrainBatch) -> Tensor:
        """``[N, T, V]`` logits of the micro-batch, in its padded layout (packed or not)."""
        with self._autocast():
            if not self.pack_sequences:
                return model(
                    input_ids=micro.input_ids, attention_mask=micro.attention_mask, use_cache=False
                ).logits
            return packed_logits(model, micro.input_ids, micro.attention_mask)

    def _token_outputs(
        self, model: nn.Module, micro: TrainBatch, entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``[N, T]`` log-probs and, if asked, entropies of the micro-batch's tokens."""
        if self.prompt_sharing:
            layout = share_prompts(micro.input_ids, micro.attention_mask, micro.prompt_lens)
            # Sharded ranks must all make the same two passes (FSDP's collectives run per
            # pass), so only a plain process falls back when nothing is shared.
            if self.sharded or layout.n_prompts < len(micro):
                with self._autocast():
                    table = shared_logits(model, layout)
                return logprobs_from_rows(
                    table,
                    layout.source,
                    micro.input_ids,
                    micro.attention_mask,
                    self.temperature,
                    entropy=entropy,
                )
        logits = self._logits(model, micro)
        logprobs = logprobs_from_logits(
            logits, micro.input_ids, micro.attention_mask, self.temperature
        )
        if not entropy:
            return logprobs, None
        return logprobs, entropy_from_logits(logits, micro.attention_mask, self.temperature)

    def _logprobs(self, model: nn.Module, micro: TrainBatch) -> Tensor:
        return self._token_outputs(model, micro, entropy=False)[0]

    def _micro_batch_indices(self, batch: TrainBatch, rows_per_example: int = 1) -> list[Tensor]:
        if self.prompt_sharing and rows_per_example == 1:
            return shared_micro_batch_indices(batch, self.micro_batch_tokens)
        return micro_batch_indices(batch, self.micro_batch_tokens, group_size=rows_per_example)

    def _values(self, model: nn.Module, micro: TrainBatch) -> Tensor:
        with self._autocast():
            return model(micro.input_ids, micro.attention_mask)

    def _rounds(self, n_local: int) -> int:
        """Micro-batch passes every rank makes: FSDP collectives need the same count."""
        return int(all_reduce_max(float(n_local))) if self.sharded else n_local

    def _placeholder(self) -> TrainBatch:
        """A two-token row that stands in when this rank has run out of micro-batches."""
        ones = torch.ones((1, 2), dtype=torch.long, device=self.device)
        zeros = torch.zeros((1, 2), device=self.device)
        return TrainBatch(
            input_ids=ones * 0,
            attention_mask=ones,
            loss_mask=zeros,
            behaviour_logprobs=zeros,
            versions=-ones,
            rewards=zeros[:, 0],
            prompt_lens=ones[:, 0],
        )

    @torch.no_grad()
    def _no_grad_outputs(self, model: nn.Module, batch: TrainBatch, forward: Forward) -> Tensor:
        model.eval()
        indices = self._micro_batch_indices(batch)
        parts = []
        for i in range(self._rounds(len(indices))):
            if i < len(indices):
                micro = batch.select(indices[i]).trim().to(self.device)
                parts.append(forward(model, micro).float().cpu())
            else:
                forward(model, self._placeholder())
        return scatter_rows(parts, indices, len(batch), batch.width)

    def compute_logprobs(self, batch: TrainBatch) -> Tensor:
        """``[N, T]`` log-probs of the current weights (no grad): proximal log-probs."""
        if self.with_value_head:
            raise ValueError("this learner is a critic: use compute_values")
        return self._no_grad_outputs(self.model, batch, self._logprobs)

    def compute_reference_logprobs(self, batch: TrainBatch) -> Tensor:
        """``[N, T]`` log-probs of the frozen reference model (for KL terms)."""
        if self._reference_is_base:
            with self.model.disable_adapter():  # type: ignore[operator]
                return self._no_grad_outputs(self.model, batch, self._logprobs)
        if self.reference is None:
            raise ValueError("no reference model: pass reference_model_dir to the Learner")
        return self._no_grad_outputs(self.reference, batch, self._logprobs)

    def compute_values(self, batch: TrainBatch) -> Tensor:
        """``[N, T]`` critic values ``V(s_t)`` (see value_model.py for the alignment)."""
        if not self.with_value_head:
            raise ValueError("compute_values needs Learner(with_value_head=True)")
        return self._no_grad_outputs(self.model, batch, self._values)

    # --- training -----------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One optimiser step on this rank's ``batch`` (collective); returns global statistics."""
        start = time.perf_counter()
        if len(batch) == 0:
            raise ValueError("train_step needs at least one row on every rank")
        # A loss over examples of several rows (DPO's pairs) sees each example whole.
        rows_per_example = int(getattr(loss_fn, "rows_per_example", 1))
        indices = self._micro_batch_indices(batch, rows_per_example)
        micros = [batch.select(rows).trim() for rows in indices]
        normalizer = all_reduce_sum(float(loss_fn.normalizer(micros)))
        needs_entropy = bool(getattr(loss_fn, "needs_entropy", False))
        rounds = self._rounds(len(micros))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        stats, loss_sum = StatsAccumulator(), 0.0
        for i in range(rounds):
            if self.sharded:
                # Reduce-scatter once, after the last micro-batch: accumulation without traffic.
                self.model.set_requires_gradient_sync(i == rounds - 1)
            if i >= len(micros):
                self._placeholder_backward()
                continue
            micro = micros[i].to(self.device)
            outputs, entropy = self._train_outputs(micro, needs_entropy)
            if entropy is not None:
                micro = micro.with_fields(entropy=entropy)
            loss, micro_stats = loss_fn(micro, outputs, normalizer)
            # The loss is already divided by the global D; FSDP2 then averages over R ranks,
            # so scaling by R leaves the gradient of the summed (global) loss.
            (loss * self.world_size).backward()
            loss_sum += float(loss.detach())
            # Means over loss tokens, or over examples when an example spans rows.
            weight = len(micro) / rows_per_example if rows_per_example > 1 else micro.n_loss_tokens
            stats.add(micro_stats, weight=weight)
        grad_norm, lr = self._optimizer_step()
        totals = all_reduce_sum(
            torch.tensor(
                [loss_sum, batch.n_tokens, batch.n_loss_tokens, len(batch)], dtype=torch.float64
            )
        ).tolist()
        result = stats.reduce()
        result.update(
            loss=totals[0],
            grad_norm=grad_norm,
            lr=lr,
            tokens=totals[1],
            loss_tokens=totals[2],
            sequences=totals[3],
            micro_batches=float(rounds),
            step=float(self.step),
            seconds=time.perf_counter() - start,
        )
        return result

    def _train_outputs(self, micro: TrainBatch, entropy: bool) -> tuple[Tensor, Tensor | None]:
        """Model outputs with grad (values or log-probs) and, if asked, the entropy."""
        if self.with_value_head:
            if entropy:
                raise ValueError("a critic has no entropy: use a loss with needs_entropy=False")
            return self._values(self.model, micro), None
        return self._token_outputs(self.model, micro, entropy)

    def _placeholder_backward(self) -> None:
        placeholder = self._placeholder()
        if self.with_value_head:
            outputs = self._values(self.model, placeholder)
        else:
            outputs = self._logprobs(self.model, placeholder)
        # Zero gradient, but it runs FSDP's backward hooks (and their collectives).
        (outputs.sum() * 0.0).backward()

    def _optimizer_step(self) -> tuple[float, float]:
        """Clip, step (skipped on a non-finite gradient norm), advance the schedule."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.max_grad_norm if self.max_grad_norm else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        grad_norm = float(norm)
        lr = float(self.scheduler.get_last_lr()[0])
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("step %d: gradient norm %s, update skipped", self.step, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return grad_norm, lr

    def sft_step(self, batch: TrainBatch, *, aggregation: str = "token-mean") -> dict[str, float]:
        """``train_step`` with the masked NLL (``SFTLoss``)."""
        return self.train_step(batch, SFTLoss(aggregation=aggregation))

    def update(
        self, batch: TrainBatch, loss_fn: LossFn, *, n_minibatches: int = 1, group_size: int = 1
    ) -> list[dict[str, float]]:
        """One policy update from a training batch: ``n_minibatches`` steps, then version + 1."""
        if n_minibatches > 1 and getattr(loss_fn, "proximal_is_current", False):
            raise ValueError(
                "proximal_is_current holds for one optimiser step only: "
                "pass proximal_logprobs when n_minibatches > 1"
            )
        stats = [
            self.train_step(minibatch, loss_fn)
            for minibatch in split_minibatches(batch, n_minibatches, group_size=group_size)
        ]
        self.version += 1
        return stats

    # --- weights and checkpoints ------------------------------------------------------------
    def full_state_dict(self) -> dict[str, Tensor]:
        """Full float32 CPU state dict on rank 0, ``{}`` on other ranks (collective).

        With LoRA: the merged weights under the base model's names (what the engines load).
        """
        state = checkpoint.full_state_dict(self.model)
        return merged_state_dict(state, self._scalings) if self.lora is not None else state

    def serving_state_dict(self) -> dict[str, Tensor]:
        """The tensors an inference engine loads, as :meth:`export_hf` writes them: merged LoRA,
        the compute dtype, no ``lm_head.weight`` when tied (rank 0; ``{}`` elsewhere; collective)."""
        state = self.full_state_dict()
        if getattr(self.model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        return {k: v.detach().to(self.compute_dtype).contiguous() for k, v in state.items()}

    def export_hf(self, directory: str | Path, *, dtype: str | None = None) -> Path:
        """Write a ``from_pretrained`` folder (rank 0; collective) for the inference engines,
        or, for a value model, its backbone and head (a reward model: value_model.py).

        ``dtype`` defaults to the learner's compute dtype.
        """
        out_dtype = self.compute_dtype if dtype is None else torch_dtype(dtype)
        state = checkpoint.full_state_dict(self.model)
        if self.with_value_head:
            backbone, head = split_state(state)
            extra = functools.partial(save_value_head, head)
            checkpoint.export_hf(backbone, self.model_dir, directory, dtype=out_dtype, extra=extra)
            return Path(directory)
        weights, adapter = state, None
        if self.lora is not None:
            weights = merged_state_dict(state, self._scalings)
            adapter = functools.partial(save_adapter, self.model, state)
        checkpoint.export_hf(weights, self.model_dir, directory, dtype=out_dtype, extra=adapter)
        return Path(directory)

    def save_checkpoint(self, url: str, *, extra: dict[str, Any] | None = None) -> None:
        """Sharded model/optimizer/schedule/counters to ``url`` (a path or fsspec URL)."""
        meta = {
            "step": self.step,
            "version": self.version,
            "extra": extra or {},
            "lora": self._lora_meta(),
        }
        checkpoint.save_state(
            str(url),
            self.model,
            self.optimizer,
            self.scheduler,
            meta,
            trainable_only=self.lora is not None,
        )

    def load_checkpoint(self, url: str) -> dict[str, Any]:
        """Restore a ``save_checkpoint`` in place; returns the ``extra`` saved with it."""
        self._check_lora_meta(str(url), checkpoint.read_meta(str(url)).get("lora"))
        meta = checkpoint.load_state(
            str(url),
            self.model,
            self.optimizer,
            self.scheduler,
            trainable_only=self.lora is not None,
        )
        self.step, self.version = int(meta["step"]), int(meta["version"])
        if self.step == 0:
            # Saved before any update: AdamW must start from an empty state (see save_state).
            self.optimizer.state.clear()
        return meta["extra"]

    def _lora_meta(self) -> dict[str, Any] | None:
        """The adapters' settings and the base they sit on (a LoRA checkpoint holds no base)."""
        if self.lora is None:
            return None
        return {**self.lora.to_json(), "base": str(self.model_dir)}

    def _check_lora_meta(self, url: str, saved: dict[str, Any] | None) -> None:
        mismatch = lora_mismatch(saved, self.lora)
        if mismatch is not None:
            raise ValueError(f"checkpoint {url}: {mismatch}")
        if saved is not None and saved["base"] != str(self.model_dir):
            logger.warning(
                "checkpoint %s holds adapters trained on %s; loading them on %s (the same "
                "weights are assumed)",
                url,
                saved["base"],
                self.model_dir,
            )


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases and norm weights (1-D tensors), as is standard for LMs.

    Frozen parameters (the base model under LoRA) are left out.
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
