"""The CUDA paths, on a model built locally (no hub): our engine in bfloat16, the FSDP2 learner
over NCCL, one RL step end to end, flash-attention when installed. ``infra/gpu_check.sh`` runs
these on a GPU machine; without a CUDA device they skip (``tests/conftest.py``)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from core.inference.api import GenerationRequest, SamplingParams
from core.inference.engine.hf_engine import HFEngine
from core.models.builder import create_pretrained
from core.training import spawn_local
from tests.core.inference.helpers import run
from tests.core.training.helpers import ADAM, CORPUS, ppo_batch, ppo_runs

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_pretrained("tiny", CORPUS, tmp_path_factory.mktemp("tiny"), vocab_size=300)


@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_engine_generates_in_bfloat16_on_cuda(model_dir: Path, attn: str) -> None:
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed (the gpu extra)")
    engine = HFEngine.from_pretrained(model_dir, dtype="bfloat16", attn_implementation=attn)
    with engine:
        assert engine.device.type == "cuda"
        assert next(engine.model.parameters()).dtype == torch.bfloat16
        sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
        requests = [GenerationRequest([1, 2, 3, 4 + i], sampling) for i in range(8)]

        async def many():
            import asyncio

            return await asyncio.gather(*(engine.agenerate(r) for r in requests))

        responses = run(many())
    for response in responses:
        assert 0 < len(response.output_ids) <= 16
        assert all(math.isfinite(lp) and lp <= 0 for lp in response.logprobs)


def test_fsdp2_learner_over_nccl(model_dir: Path) -> None:
    from core.models import load_tokenizer

    batch = ppo_batch(model_dir, load_tokenizer(model_dir), 8)
    runs = [dict(learner_kw=ADAM, micro_batch_tokens=10_000)]
    world = min(2, torch.cuda.device_count())
    ranks = spawn_local(ppo_runs, world, model_dir, batch, runs)
    for rank in ranks:
        stats = rank[0]["stats"]
        assert all(math.isfinite(s["loss"]) for s in stats)
    assert ranks[0][0]["sharded"] == (world > 1)


def test_one_rl_step_end_to_end_on_cuda(tmp_path: Path) -> None:
    from core.config import load_config
    from core.runtime.job import Pipeline

    config = load_config(
        ROOT / "experiments" / "quickstart.yaml",
        [f"cluster.fileroot={tmp_path}", "model.dtype=bfloat16", "data.n_train=64",
         "data.n_test=16", "eval.n_problems=16", "sft.steps=4", "rollout.batch_size=4",
         "algorithm.group_size=4", "learner.total_steps=1", "eval.every_n_steps=0"],
    )  # fmt: skip
    summary = Pipeline(config).run()
    assert summary["steps"] == 1
    assert 0.0 <= summary["accuracy_after"] <= 1.0
