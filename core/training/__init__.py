"""Training: the FSDP2 learner, its batch format, losses, LR schedule and checkpoints.

* ``batch``: ``TrainBatch``, ``collate`` (trajectories -> padded tensors; alignment convention),
  minibatch/micro-batch/rank splitting.
* ``logprobs``: teacher-forced per-token log-probs and entropy matching the inference engines.
* ``losses``: the ``LossFn`` protocol (global normaliser + per-micro-batch loss) and the policy,
  SFT and value losses built on ``core.algorithms``.
* ``learner``: ``Learner`` (one per rank; FSDP2 when a process group exists).
* ``lora``: ``LoraSpec``: peft LoRA adapters on the policy, merged for the engines.
* ``checkpoint``: sharded DCP checkpoints to any fsspec URL, HF export for weight publishing.
* ``distributed``: process-group setup, small collectives, ``spawn_local`` for tests.
"""

from core.training.batch import (
    TrainBatch,
    budget_lengths,
    collate,
    micro_batch_indices,
    micro_batches,
    scatter_rows,
    shard_rows,
    split_minibatches,
)
from core.training.checkpoint import (
    checkpoint_complete,
    checkpoint_problems,
    hf_folder_problems,
)
from core.training.distributed import (
    DistInfo,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    destroy_distributed,
    dist_info,
    get_rank,
    get_world_size,
    init_distributed,
    is_main,
    spawn_local,
)
from core.training.learner import Learner
from core.training.logprobs import (
    entropy_from_logits,
    logprobs_from_logits,
    token_logprobs,
    token_logprobs_and_entropy,
)
from core.training.lora import LoraSpec
from core.training.losses import (
    DPOLoss,
    LossFn,
    PolicyLoss,
    RewardModelLoss,
    SFTLoss,
    ValueLoss,
)
from core.training.lr_schedule import WarmupCosine, warmup_cosine_schedule
from core.training.stats import StatsAccumulator

__all__ = [
    "DistInfo",
    "Learner",
    "LoraSpec",
    "LossFn",
    "PolicyLoss",
    "SFTLoss",
    "DPOLoss",
    "RewardModelLoss",
    "StatsAccumulator",
    "TrainBatch",
    "ValueLoss",
    "WarmupCosine",
    "all_reduce_max",
    "all_reduce_sum",
    "barrier",
    "budget_lengths",
    "checkpoint_complete",
    "checkpoint_problems",
    "hf_folder_problems",
    "collate",
    "destroy_distributed",
    "dist_info",
    "entropy_from_logits",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_main",
    "logprobs_from_logits",
    "micro_batch_indices",
    "micro_batches",
    "scatter_rows",
    "shard_rows",
    "spawn_local",
    "split_minibatches",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "warmup_cosine_schedule",
]
