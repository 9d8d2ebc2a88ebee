"""FSDP2 wrapping of the learner's models (``torch.distributed.fsdp.fully_shard``).

Each decoder layer is its own FSDP unit and the root module takes the rest (embeddings, final
norm, heads; tied embeddings therefore stay in one unit). FSDP2 works with gloo on CPU and
NCCL on GPUs; FSDP1 is avoided because its full-state-dict gather crashes on CPU.

Reduced precision: with ``param_dtype`` below float32 the master weights stay float32 and FSDP
all-gathers/computes in ``param_dtype`` while reducing gradients in float32. Without a process
group (a single plain process) the learner uses ``torch.autocast`` for the same effect.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from core.training.distributed import get_world_size

logger = logging.getLogger(__name__)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a HF causal LM or a ``ValueModel``."""
    if hasattr(model, "decoder_layers"):
        return model.decoder_layers()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers in {type(model).__name__}")
    return layers


def shard_model(
    model: nn.Module, device: torch.device, *, param_dtype: torch.dtype = torch.float32
) -> FSDPModule:
    """Apply ``fully_shard`` per decoder layer and to the root, over all ranks (in place)."""
    mesh = init_device_mesh(device.type, (get_world_size(),))
    if param_dtype == torch.float32:
        policy = MixedPrecisionPolicy()
    else:
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    logger.info("FSDP2: %d layers + root over %d ranks", len(decoder_layers(model)), mesh.size())
    assert isinstance(model, FSDPModule)
    return model
