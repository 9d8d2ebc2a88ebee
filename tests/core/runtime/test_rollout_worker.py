"""The rollout side for real: HF engine + RLVR workflow + executor, with weights published from disk.

A scripted learner perturbs the weights, saves them as a HF folder and publishes each version, as
the train loop will; the worker runs in this process and in a spawned subprocess (ProcessActor),
through the typed handle the train loop uses.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from core.config import load_config
from core.data.dataloader import ResumableDataLoader
from core.data.synthetic import SyntheticSpec, generate_problems
from core.models import create_pretrained, load_model, load_tokenizer
from core.runtime.actors import InProcessActor, ProcessActor
from core.runtime.handles import RolloutHandle, typed
from core.runtime.rollout_worker import RolloutWorker
from core.runtime.stages import training_texts

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("rollout")
    train = generate_problems(64, SyntheticSpec(), seed=0)
    model_dir = create_pretrained(
        "tiny", training_texts(train, "plain"), root / "v0", vocab_size=300, seed=0
    )
    # versions 1..4: perturbed copies, as a learner would publish them
    tokenizer = load_tokenizer(model_dir)
    for version in range(1, 5):
        tokenizer.save_pretrained(root / f"v{version}")
        model = load_model(model_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        model.save_pretrained(root / f"v{version}")
    return root, train


def config(eta: int, *overrides: str):
    return load_config(
        ROOT / "experiments" / "quickstart.yaml",
        [
            *overrides,
            f"rollout.max_staleness={eta}",
            "rollout.batch_size=4",
            "algorithm.group_size=2",
            "sampling.max_new_tokens=12",
            "rollout.max_concurrent=16",
            "scheduler.torch_threads=1",
        ],
    )


def drive(worker: RolloutHandle, root: Path, steps: int, eta: int) -> list:
    batches = []
    for step in range(steps):
        batch = worker.prepare_batch(120)
        batches.append(batch)
        for group in batch:
            assert step - group.oldest_version <= eta
            assert len(group.trajectories) == 2
        worker.update_weights(str(root / f"v{step + 1}"), step + 1)
    return batches


@pytest.mark.integration
@pytest.mark.parametrize("eta", [0, 2])
def test_worker_in_process_respects_eta(setup, eta: int) -> None:
    root, train = setup
    worker = typed(
        InProcessActor(RolloutWorker, config(eta), str(root / "v0"), train), RolloutHandle
    )
    try:
        # The starting eval runs alone: rollouts start with the first batch asked for (work
        # done during an eval would count as trained samples without its time).
        worker.evaluate(train[:4])
        assert worker.stats()["submitted"] == 0
        batches = drive(worker, root, steps=4, eta=eta)
        stats = worker.stats()
    finally:
        worker.close()
    assert stats["version"] == 4 and stats["consumed"] == 16
    assert max(stats["staleness"]) <= eta
    for step, batch in enumerate(batches):
        for group in batch:
            for traj in group.trajectories:
                generated = [v for v, m in zip(traj.versions, traj.loss_mask) if m]
                assert generated and max(generated) <= step
                assert traj.reward in (0.0, 1.0)
                if eta == 0:
                    assert set(generated) == {step}  # synchronous: nothing stale
    ids = [g.sample_id for b in batches for g in b]
    assert len(ids) == len(set(ids))  # every prompt used once in the first epoch


@pytest.mark.integration
def test_worker_in_subprocess_and_resume_state(setup) -> None:
    root, train = setup
    cfg = config(1)
    actor = ProcessActor(RolloutWorker, cfg, str(root / "v0"), train, name="rollout")
    worker = typed(actor, RolloutHandle)
    try:
        first = drive(worker, root, steps=2, eta=1)
        state = worker.state_dict()
        following = [g.sample_id for g in worker.prepare_batch(120)]
        evaluation = worker.evaluate(train[:8])
    finally:
        worker.close()
    assert not actor.process.is_alive()
    assert evaluation["n"] == 8 and 0.0 <= evaluation["accuracy"] <= 1.0
    assert state["counters"]["consumed"] == 8
    # A worker restored from the state draws the same not-yet-consumed prompts again.
    resumed = typed(
        InProcessActor(RolloutWorker, cfg, str(root / "v2"), train, version=2, state=state),
        RolloutHandle,
    )
    try:
        again = [g.sample_id for g in resumed.prepare_batch(120)]
    finally:
        resumed.close()
    consumed = {g.sample_id for b in first for g in b}
    assert not consumed & set(again)
    # The state points at the oldest prompt not yet consumed: both the original worker's next
    # batch and the resumed worker's first batch come from the prompts drawn from there on.
    loader = ResumableDataLoader(train, batch_size=1, shuffle=True, seed=cfg.experiment.seed)
    loader.load_state_dict(state["dataloader"])
    window = {s["id"] for s in loader.next_samples(16)}
    assert set(following) <= window and set(again) <= window


def _teacher_forced(model_dir: Path, traj) -> list[float]:
    """The log-probs ``model_dir`` gives the trajectory's generated tokens (temperature 1)."""
    model = load_model(model_dir).eval()
    ids = torch.tensor([traj.input_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    picked = logprobs.gather(1, ids[0, 1:, None])[:, 0].tolist()
    return [lp for lp, m in zip(picked, traj.loss_mask[1:]) if m]


@pytest.mark.integration
def test_running_server_gets_the_runs_starting_weights(setup, tmp_path: Path) -> None:
    """A server someone else started (on the base weights) serves the run's starting weights
    (v1 here, as after SFT) before the first rollout; a resumed run's worker brings it back from
    a later version to the checkpoint's (v2 at version 2), which the forward-only version rule
    otherwise refuses."""
    import httpx

    from core.inference.clients.sglang_launcher import SGLangLaunchSpec, launch
    from core.runtime.fleet import free_port

    root, train = setup
    spec = SGLangLaunchSpec(
        str(root / "v0"), port=free_port(), module="core.inference.server",
        python_executable=sys.executable, extra_args=["--torch-threads", "1"],
    )  # fmt: skip
    server = launch(spec, tmp_path / "server.log", health_timeout_s=120)
    overrides = ["inference.engine=sglang", f"inference.server_addresses=[{server.address}]"]
    cfg = config(0, *overrides)
    try:
        worker = typed(InProcessActor(RolloutWorker, cfg, str(root / "v1"), train), RolloutHandle)
        try:
            info = httpx.get(server.url + "/get_model_info").json()
            assert (info["model_path"], info["weight_version"]) == (str(root / "v1"), "0")
            traj = worker.prepare_batch(120)[0].trajectories[0]
            worker.update_weights(str(root / "v4"), 4)
        finally:
            worker.close()
        served = [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m]
        assert served == pytest.approx(_teacher_forced(root / "v1", traj), abs=2e-4)
        assert served != pytest.approx(_teacher_forced(root / "v0", traj), abs=2e-4)

        resumed = typed(
            InProcessActor(RolloutWorker, cfg, str(root / "v2"), train, version=2), RolloutHandle
        )
        try:
            info = httpx.get(server.url + "/get_model_info").json()
            assert (info["model_path"], info["weight_version"]) == (str(root / "v2"), "2")
            batch = resumed.prepare_batch(120)
        finally:
            resumed.close()
        versions = {
            v for g in batch for t in g.trajectories for v, m in zip(t.versions, t.loss_mask) if m
        }
        assert versions == {2}
    finally:
        server.stop()
