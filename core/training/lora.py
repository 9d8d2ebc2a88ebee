"""LoRA adapters on the RL policy (``model.lora_rank`` > 0), through peft.

What trains
    ``apply_lora`` wraps the policy with peft's ``get_peft_model``: beside each target linear
    layer ``W`` sit ``A`` (r × in) and ``B`` (out × r), and the layer computes
    ``W x + (alpha / r) · B A x`` (Hu et al. 2021, https://arxiv.org/abs/2106.09685). ``W`` is
    frozen and ``B`` starts at zero, so the wrapped model starts as the base model. The learner
    then shards it with FSDP2 as before (a decoder layer and its adapters form one unit); only
    ``A`` and ``B`` reach the optimiser.

What the engines get
    ``merged_state_dict`` folds each adapter into its weight, ``W + (alpha / r) · B A``, under the
    base model's Hugging Face names, on the gathered CPU copy (the training model is untouched):
    every engine loads it as it loads a full fine-tune. ``save_adapter`` writes the adapter alone
    (``adapter_model.safetensors`` + ``adapter_config.json``) for ``PeftModel.from_pretrained``.

The KL reference
    The base weights never change, so the policy with its adapters disabled *is* the initial
    policy: no second model is loaded.

Checkpoints
    The learner saves the trainable parameters (the adapters) with their AdamW state, and the
    settings with the base model folder in the checkpoint's meta; on resume the base is re-read
    from that folder (the RL stage's initial model) and ``lora_mismatch`` refuses other settings.

Not covered: the SFT warm start and the critic train all their weights (LoRA applies on top of
the post-SFT model); DoRA, rsLoRA and adapters on embeddings or the output layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.models.lora_targets import ALL_LINEAR, target_module_problem

Tensor = torch.Tensor

ADAPTER = "default"  # peft's name for the one adapter
ADAPTER_FOLDER = "adapter"  # inside every HF export of a LoRA policy
_PEFT_PREFIX = "base_model.model."  # what peft puts before the base model's names


@dataclass(frozen=True)
class LoraSpec:
    """Rank, scaling and placement of the adapters (``model.lora_*``)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...] = (ALL_LINEAR,)
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"model.lora_rank must be >= 1 for adapters, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"model.lora_alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora_dropout must be in [0, 1), got {self.dropout}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "target_modules": list(self.target_modules)}


def apply_lora(model: nn.Module, spec: LoraSpec, *, seed: int) -> nn.Module:
    """``model`` wrapped by peft with trainable adapters; every base weight frozen.

    ``A``'s random initialisation is drawn from ``seed`` (the global RNG is left alone): every
    FSDP rank must start from the same adapters, as it does from the same base weights.
    """
    # peft takes ~2.5 s to import; full fine-tuning never pays for it.
    from peft import LoraConfig, get_peft_model

    problem = target_module_problem(model, spec.target_modules)
    if problem is not None:
        raise ValueError(problem)
    targets = list(spec.target_modules)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else targets,
        lora_dropout=spec.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, config)
    assert all(
        ".lora_" in name for name, param in wrapped.named_parameters() if param.requires_grad
    ), "only adapter parameters may train"
    return wrapped


def lora_scalings(model: nn.Module) -> dict[str, float]:
    """``{module name: alpha / r}`` for every adapted layer (names as in the state dict)."""
    return {
        name: float(module.scaling[ADAPTER])
        for name, module in model.named_modules()
        if isinstance(getattr(module, "scaling", None), dict) and hasattr(module, "lora_A")
    }


def merged_state_dict(state: dict[str, Tensor], scalings: dict[str, float]) -> dict[str, Tensor]:
    """The base model's state dict with each adapter folded in: ``W + scale · B A``.

    ``state`` is the wrapped model's full state dict (peft names); the result has the base
    model's names and shapes and no adapter tensors. ``{}`` (a non-zero rank) gives ``{}``.
    """
    merged: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if ".lora_" in key:
            continue
        module, _, leaf = key.rpartition(".")
        if module.endswith(".base_layer"):
            module = module.removesuffix(".base_layer")
            if leaf == "weight":
                a = state[f"{module}.lora_A.{ADAPTER}.weight"]
                b = state[f"{module}.lora_B.{ADAPTER}.weight"]
                tensor = tensor + scalings[module] * (b.to(tensor.dtype) @ a.to(tensor.dtype))
        merged[f"{module}.{leaf}".removeprefix(_PEFT_PREFIX)] = tensor
    return merged


def lora_mismatch(saved: dict[str, Any] | None, spec: LoraSpec | None) -> str | None:
    """Why a checkpoint's LoRA settings (its meta ``lora``) cannot load into a learner with
    ``spec``, or None when they match."""
    mine = spec.to_json() if spec is not None else None
    theirs = {k: v for k, v in saved.items() if k != "base"} if saved is not None else None
    if theirs == mine:
        return None
    return (
        f"saved with LoRA {_describe(theirs)}, this learner has LoRA {_describe(mine)}: "
        "set model.lora_* as in the run that saved it"
    )


def _describe(settings: dict[str, Any] | None) -> str:
    if settings is None:
        return "off (all weights trained)"
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def save_adapter(model: nn.Module, state: dict[str, Tensor], export_dir: Path) -> None:
    """Write the adapter of ``state`` (the wrapped model's full state dict) into
    ``export_dir/adapter`` with peft's ``save_pretrained`` (no collectives: rank 0 alone calls
    it). ``adapter_config.json`` names the base model folder."""
    model.save_pretrained(  # type: ignore[operator]
        str(export_dir / ADAPTER_FOLDER), state_dict=state, save_embedding_layers=False
    )
