"""Two FSDP2 ranks over gloo (spawned processes) against one plain process; DCP checkpoints
to a local folder and to S3 (a real moto server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from core.training import (
    Learner,
    TrainBatch,
    checkpoint_complete,
    micro_batch_indices,
    shard_rows,
    spawn_local,
)
from tests.core.training.helpers import (
    ADAM,
    SGD_LIKE,
    abort_on_rank,
    checkpoint_round_trip,
    collectives_then_fail,
    critic_run,
    equivalence_suite,
    make_batch,
    max_abs_diff,
    ppo_batch,
    ppo_runs,
)

pytestmark = pytest.mark.integration

# Tolerances of the 1-rank vs 2-rank comparison (float32, 2 PPO steps, KL + entropy terms).
LOSS_RTOL = 1e-6  # loss, policy loss, KL, entropy: only summation order differs
GRAD_NORM_RTOL = 1e-5
SGD_LIKE_WEIGHT_ATOL = 1e-6  # weights move ~3e-3; measured max difference ~1e-8
ADAM_WEIGHT_ATOL = 5e-5  # 5 % of lr: Adam's g/|g| amplifies rounding on near-zero gradients


def test_two_ranks_match_one_rank(model_dir, tokenizer) -> None:
    batch = ppo_batch(model_dir, tokenizer, 8)
    # Longest rows first: rank 0 then needs more micro-batches than rank 1, so rank 1 runs
    # placeholder passes to keep FSDP's collectives in step.
    batch = batch.select(batch.seq_lens.argsort(descending=True, stable=True))
    budget = next(b for b in range(16, 256) if _counts(batch, b)[0] > _counts(batch, b)[1])
    halves = _counts(batch, budget)
    runs: list[dict[str, Any]] = [
        dict(learner_kw=SGD_LIKE, micro_batch_tokens=budget),
        dict(learner_kw=ADAM, micro_batch_tokens=budget),
    ]
    critic = dict(learner_kw=SGD_LIKE, micro_batch_tokens=budget)
    ranks = spawn_local(equivalence_suite, 2, model_dir, batch, runs, critic)
    single = ppo_runs(model_dir, batch, [dict(run, micro_batch_tokens=10_000) for run in runs])
    _check_critic(critic_run(model_dir, batch, **critic), [r["critic"] for r in ranks])
    for run, weight_atol, one, two, two_other in zip(
        runs,
        (SGD_LIKE_WEIGHT_ATOL, ADAM_WEIGHT_ATOL),
        single,
        ranks[0]["ppo"],
        ranks[1]["ppo"],
    ):
        assert (two["rows"], two_other["rows"], two_other["state"]) == (4, 4, {})
        for a, b, b_other in zip(one["stats"], two["stats"], two_other["stats"]):
            assert b == b_other | {"seconds": b["seconds"]}  # every rank reports the same stats
            assert b["micro_batches"] == halves[0]
            for key in ("loss", "policy_loss", "kl", "entropy", "behav_weight_mean"):
                assert b[key] == pytest.approx(a[key], rel=LOSS_RTOL, abs=1e-9), key
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=GRAD_NORM_RTOL)
            assert b["tokens"] == a["tokens"] and b["loss_tokens"] == a["loss_tokens"]
        diff = max_abs_diff(one["state"], two["state"])
        print(f"1 vs 2 ranks, eps={run['learner_kw'].get('eps', 1e-8)}: max |dw| = {diff:.2e}")
        assert diff <= weight_atol


def _check_critic(one: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """A 2-rank FSDP2 critic (value head + sharded backbone) matches the plain one."""
    for rows, rank in zip(one["values"].split(len(one["values"]) // 2), ranks):
        width = rank["values"].shape[1]  # each rank's share is trimmed to its own width
        torch.testing.assert_close(rank["values"], rows[:, :width], atol=1e-6, rtol=0)
    for a, b in zip(one["stats"], ranks[0]["stats"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=LOSS_RTOL)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=GRAD_NORM_RTOL)
    diff = max_abs_diff(one["state"], ranks[0]["state"])
    print(f"critic, 1 vs 2 ranks: max |dw| = {diff:.2e}")
    assert diff <= SGD_LIKE_WEIGHT_ATOL


def test_fsdp_at_world_size_one_matches_a_plain_process(model_dir, tokenizer) -> None:
    batch = ppo_batch(model_dir, tokenizer, 4, seed=1)
    runs: list[dict[str, Any]] = [dict(learner_kw=SGD_LIKE, micro_batch_tokens=40, n_steps=1)]
    ((fsdp,),) = spawn_local(ppo_runs, 1, model_dir, batch, runs)
    (plain,) = ppo_runs(model_dir, batch, runs)
    assert fsdp["sharded"] and not plain["sharded"]
    assert fsdp["stats"][0]["loss"] == pytest.approx(plain["stats"][0]["loss"], rel=LOSS_RTOL)
    assert max_abs_diff(fsdp["state"], plain["state"]) <= SGD_LIKE_WEIGHT_ATOL


def _counts(batch: TrainBatch, budget: int) -> list[int]:
    """Micro-batches each of 2 ranks makes of its contiguous half of ``batch``."""
    return [len(micro_batch_indices(shard_rows(batch, rank, 2), budget)) for rank in (0, 1)]


def _s3_env(endpoint: str, options: dict[str, Any]) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": options["key"],
        "AWS_SECRET_ACCESS_KEY": options["secret"],
        "AWS_DEFAULT_REGION": options["client_kwargs"]["region_name"],
    }


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch) -> tuple[str, dict[str, str]]:
    """(checkpoint URL prefix, environment for the ranks); S3 env also set here via monkeypatch."""
    if request.param == "local":
        return str(tmp_path), {}
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    env = _s3_env(endpoint, request.getfixturevalue("s3_storage_options"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return f"s3://{bucket}", env


def test_two_rank_checkpoint_round_trip(model_dir, tokenizer, store, request) -> None:
    prefix, env = store
    url = f"{prefix}/run/step_2"
    batch = make_batch(tokenizer, 6, seed=11)
    ranks = spawn_local(checkpoint_round_trip, 2, model_dir, batch, url, 2, env=env)
    rank0 = ranks[0]
    assert rank0["extra"] == {"k": 2} and rank0["counters"] == (2, 3)
    for key in ("loss", "grad_norm", "lr"):
        assert rank0["got"][key] == rank0["expected"][key], key
    assert all(torch.equal(rank0["have"][k], rank0["want"][k]) for k in rank0["want"])
    assert checkpoint_complete(url)
    if prefix.startswith("s3://"):
        keys = _bucket_keys(request, prefix)
        assert {
            "run/step_2/.metadata",
            "run/step_2/__0_0.distcp",
            "run/step_2/__1_0.distcp",
        } <= keys
        assert not Path("s3:").exists()  # the FileSystemWriter trap

    # DCP reshards: the 2-rank checkpoint loads into one plain process, and saves/loads there too.
    single = Learner(model_dir, **ADAM, micro_batch_tokens=48)
    single.load_checkpoint(url)
    assert (single.step, single.version) == (2, 3)
    state = single.full_state_dict()
    assert all(torch.equal(state[k], rank0["saved"][k]) for k in state)
    single.save_checkpoint(f"{prefix}/run/single")
    again = Learner(model_dir, **ADAM, micro_batch_tokens=48)
    again.load_checkpoint(f"{prefix}/run/single")
    state = again.full_state_dict()
    assert all(torch.equal(state[k], rank0["saved"][k]) for k in state)


def _bucket_keys(request, prefix: str) -> set[str]:
    client = request.getfixturevalue("s3_client")
    listing = client.list_objects_v2(Bucket=prefix.removeprefix("s3://"))
    return {item["Key"] for item in listing.get("Contents", [])}


def test_spawn_local_reports_a_failing_rank() -> None:
    # The ranks first check all_reduce_sum/all_reduce_max/is_main/barrier (asserts in the rank).
    with pytest.raises(Exception, match="boom on rank 1"):
        spawn_local(collectives_then_fail, 2, 1, timeout_s=120)


def test_spawn_local_keeps_results_of_a_rank_that_dies_in_teardown(caplog) -> None:
    # Died after storing its result (process-group teardown): results are kept, with a warning.
    assert spawn_local(abort_on_rank, 2, 1, True, timeout_s=120) == [0, 1]
    assert "rank 1 died with SIGABRT after every rank stored its result" in caplog.text
    # Died before: that is a failure.
    with pytest.raises(mp.ProcessExitedException, match="process 1 terminated with signal SIGABRT"):
        spawn_local(abort_on_rank, 2, 1, False, timeout_s=120)
