"""Read new policy weights (a safetensors folder or an in-memory state dict) into a live model.

The learner saves with ``save_pretrained``: one ``model.safetensors`` or sharded
``model-0000x-of-0000y.safetensors`` files, and with tied embeddings the file holds no
``lm_head.weight`` (it *is* the input embedding). Keys and shapes are checked before anything is
copied, so a bad checkpoint leaves the serving model untouched. A file that is not safetensors
(truncated, garbage) is a ``ValueError`` naming it, like any other checkpoint that does not fit:
the caller's mistake, which the server answers with a 400.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from core.inference.api import WeightSource

logger = logging.getLogger(__name__)


def local_path(path: str) -> Path:
    """A local filesystem path from ``path`` or a ``file://`` URL; remote URLs are refused."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter = a Windows drive, not a scheme
        raise ValueError(
            f"weight path {path!r}: only local folders are supported; copy remote weights "
            "to local disk (e.g. with fsspec) before the update"
        )
    return Path(path)


def safetensors_files(folder: Path) -> list[Path]:
    """``model.safetensors`` if present, else every ``*.safetensors`` shard, sorted."""
    if folder.is_file():
        return [folder]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return shards


def read_state_dict(source: WeightSource) -> Mapping[str, torch.Tensor]:
    """The tensors named by ``source`` (files are read onto the CPU)."""
    if source.state_dict is not None:
        return source.state_dict
    assert source.path is not None  # WeightSource guarantees exactly one
    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(local_path(source.path)):
        try:
            state.update(load_file(str(file), device="cpu"))
        except SafetensorError as exc:  # its own type: make it the ValueError a misfit is
            raise ValueError(f"{file} is not a readable safetensors file: {exc}") from exc
    return state


def _input_embedding_name(model: nn.Module) -> str | None:
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embedding = get_embeddings() if get_embeddings is not None else None
    if embedding is None:
        return None
    for name, param in model.named_parameters():
        if param is embedding.weight:
            return name
    return None


def complete_tied_weights(
    model: nn.Module, state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Add ``lm_head.weight`` from the input embedding when the model ties them and it is absent."""
    state = dict(state)
    expected = model.state_dict()
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    embed_name = _input_embedding_name(model)
    for name in expected:
        if name not in state and tied and name.endswith("lm_head.weight") and embed_name in state:
            state[name] = state[embed_name]
    return state


def check_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` naming missing/unexpected keys or shape mismatches."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or wrong:
        raise ValueError(
            f"new weights do not fit the model: missing={missing[:5]} unexpected={unexpected[:5]} "
            f"shape mismatches={wrong[:5]}"
        )


@torch.no_grad()
def load_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model`` in place (dtype/device converted), strictly."""
    full = complete_tied_weights(model, state)
    check_state_dict(model, full)
    model.load_state_dict(full, strict=True)
    logger.info("loaded %d tensors into the serving model", len(full))
