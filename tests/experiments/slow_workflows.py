"""Workflows that misbehave in time, by import path (``rollout.workflow=...``), for resume tests."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from core.inference.api import InferenceEngine
from core.rollout.api import Trajectory
from core.storage import local_path
from core.workflows.rlvr import RLVRWorkflow


class FirstSampleSlowWorkflow(RLVRWorkflow):
    """RLVR whose first prompt of a run is far slower than the others.

    That prompt's episodes wait, before generating, until the engine serves version
    ``RELEASE_VERSION``: a long generation with η ≥ 1, during which the prompts drawn after it
    are trained. Gating on the version rather than a clock makes the scenario independent of
    the machine's speed (on the tiny model it is some ten times an ordinary episode): the
    prompt is certainly in flight at the checkpoint of every version below the gate.
    ``MAX_WAIT_S`` keeps a broken run from hanging.

    Only the process that starts the run folder's draw log slows its first prompt: a resumed
    run (the log exists) regenerates it at ordinary speed, as newer weights might, so which
    prompts the resumed run trains does not hang on a race at the end of the run.

    Only training draws (marked ``_draw`` by the rollout worker) are slowed and logged, never
    the held-out eval's episodes. Every training episode started is appended to
    ``{run_dir}/draws.jsonl`` with the process id, so a test can tell what each process drew.
    """

    RELEASE_VERSION = 3
    MAX_WAIT_S = 120.0

    draws_path: Path | None = None
    slow_id: str | None = None
    slow_first: bool = False

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> FirstSampleSlowWorkflow:
        workflow = super().from_config(config, tokenizer)
        assert isinstance(workflow, cls)
        workflow.draws_path = local_path(config.run_dir) / "draws.jsonl"
        workflow.slow_first = not workflow.draws_path.exists()
        return workflow

    async def run_episode(self, engine: InferenceEngine, sample: dict[str, Any]) -> Trajectory:
        if "_draw" not in sample:  # a held-out eval's episode, not a training draw
            return await super().run_episode(engine, sample)
        if self.slow_id is None:
            self.slow_id = str(sample["id"])
        if self.draws_path is not None:
            self.draws_path.parent.mkdir(parents=True, exist_ok=True)
            row = {"pid": os.getpid(), "id": str(sample["id"]), "version": engine.version}
            with self.draws_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if self.slow_first and str(sample["id"]) == self.slow_id:
            deadline = time.monotonic() + self.MAX_WAIT_S
            while engine.version < self.RELEASE_VERSION and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return await super().run_episode(engine, sample)
