"""Which linear modules of a causal LM LoRA can target (``model.lora_target_modules``).

Names are matched as peft matches a list of target modules: a target ``t`` selects every module
whose name is ``t`` or ends in ``.t`` (``q_proj`` selects ``model.layers.0.self_attn.q_proj`` in
every layer). A valid target selects at least one module, and only ``nn.Linear`` modules other
than the output layer (tied to the input embedding in many small models, and never adapted by
peft's ``all-linear``). The check runs on a model skeleton built on the meta device, so a config
is checked against the architecture without reading any weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from core.models.builder import preset_config
from core.models.presets import is_preset

ALL_LINEAR = "all-linear"


def adaptable_linear_names(model: nn.Module) -> list[str]:
    """Full names of the ``nn.Linear`` modules that LoRA may target (the output layer excluded)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module is not output
    ]


def _selects(name: str, target: str) -> bool:
    return name == target or name.endswith(f".{target}")


def target_module_problem(model: nn.Module, targets: Sequence[str]) -> str | None:
    """Why ``targets`` cannot be LoRA's target modules for ``model``, or None when they can."""
    linear = adaptable_linear_names(model)
    available = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in linear}))
    if not targets:
        return f"model.lora_target_modules is empty; use [{ALL_LINEAR}] or some of: {available}"
    if ALL_LINEAR in targets:
        if len(targets) > 1:
            return f"model.lora_target_modules: '{ALL_LINEAR}' stands alone, got {list(targets)}"
        return None if linear else "the model has no linear module for LoRA"
    allowed = set(linear)
    for target in targets:
        selected = [name for name, _ in model.named_modules() if name and _selects(name, target)]
        others = [name for name in selected if name not in allowed]
        if not selected or others:
            what = f"selects {others[0]}, not an adaptable linear module" if others else ""
            return (
                f"model.lora_target_modules: {target!r} {what or 'matches no module'}; the model's linear modules: "
                f"{available} (or [{ALL_LINEAR}])"
            )
    return None


def model_skeleton(path: str, *, vocab_size: int) -> nn.Module | None:
    """The model of a preset or a local HF folder on the meta device (no weights, no memory);
    None for a hub id (its config is not fetched here)."""
    if is_preset(path):
        config = preset_config(path, vocab_size=vocab_size)
    elif (Path(path) / "config.json").is_file():
        config = AutoConfig.from_pretrained(path)
    else:
        return None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
