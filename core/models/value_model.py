"""Critic for PPO, and reward model: a causal LM's decoder backbone with a scalar value head.

``values[:, t]`` is ``V(s_t)``, the value of the state in which token ``t`` is generated — the
prefix ``input_ids[:, :t]`` — so it is read from the last hidden state at position ``t - 1``.
This is the batch alignment convention (column ``t`` describes token ``t``) that
``core.algorithms.gae_advantages`` expects; column 0 and padding are 0.

A trained one is saved as a ``from_pretrained`` folder of its backbone (``model.*`` weights, as
a causal LM's) plus ``value_head.safetensors`` (:func:`save_value_head`), which
:meth:`ValueModel.from_pretrained` loads back: a reward model, or a critic started from one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM

from core.models.builder import torch_dtype

VALUE_HEAD_FILE = "value_head.safetensors"

Tensor = torch.Tensor


class ValueModel(nn.Module):
    """``backbone`` (e.g. ``Qwen2Model``) + ``Linear(hidden, 1)`` on its last hidden state."""

    def __init__(self, backbone: nn.Module, hidden_size: int, *, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        self.value_head = nn.Linear(hidden_size, 1)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            # Small random weights (OpenRLHF's std = 1/(hidden+1)): values start near 0 while the
            # backbone still receives gradient from the first step (a zero head would block it).
            head = torch.randn(self.value_head.weight.shape, generator=generator)
            self.value_head.weight.copy_(head / (hidden_size + 1))
            self.value_head.bias.zero_()

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: str = "float32",
        seed: int = 0,
        attn_implementation: str = "sdpa",
    ) -> ValueModel:
        """The backbone of the causal LM saved in ``path`` with a fresh value head."""
        causal_lm = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch_dtype(dtype), attn_implementation=attn_implementation
        )
        backbone = causal_lm.get_decoder()
        model = cls(backbone, causal_lm.config.hidden_size, seed=seed)
        head = Path(path) / VALUE_HEAD_FILE
        if head.exists():  # a trained reward model (or critic): its head, not a fresh one
            model.value_head.load_state_dict(load_file(str(head)))
        return model.to(torch_dtype(dtype))

    def decoder_layers(self) -> nn.ModuleList:
        """The transformer blocks (the FSDP2 wrapping units)."""
        return self.backbone.layers

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """``[N, T]`` float32 values aligned with ``input_ids`` (see the module docstring)."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        values = self.value_head(hidden[:, :-1]).squeeze(-1).float()
        values = torch.cat([values.new_zeros(values.shape[0], 1), values], dim=1)
        return torch.where(attention_mask.bool(), values, 0.0)


def last_token_values(values: Tensor, attention_mask: Tensor) -> Tensor:
    """``[N]``: each row's value at its last real token (rows right-padded) — a reward model's
    score of the whole sequence."""
    last = attention_mask.sum(-1).long().clamp(min=1) - 1
    return values.gather(1, last[:, None]).squeeze(1)


def split_state(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A ``ValueModel`` state dict as (causal-LM backbone weights ``model.*``, value head)."""
    backbone = {f"model.{k.removeprefix('backbone.')}": v for k, v in state.items()
                if k.startswith("backbone.")}  # fmt: skip
    head = {
        k.removeprefix("value_head."): v for k, v in state.items() if k.startswith("value_head.")
    }
    return backbone, head


def save_value_head(head: dict[str, Tensor], directory: Path) -> None:
    """Write the head beside an exported backbone (``export_hf``'s ``extra``)."""
    save_file(
        {k: v.detach().float().contiguous() for k, v in head.items()},
        str(directory / VALUE_HEAD_FILE),
    )
