"""The rollout side of a run in one process: engine + workflow + staleness-bounded executor.

It owns an asyncio event loop on a background thread, so episodes keep generating between calls
(that is the asynchrony): the train loop only calls ``prepare_batch`` to take finished groups and
``update_weights`` to publish. Every public method is synchronous and picklable-argument-only,
so the same class runs in-process, as a Ray actor, or behind a process boundary.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import torch

from core.config import Config
from core.data.dataloader import ResumableDataLoader
from core.evaluation import eval_settings, evaluate_workflow
from core.inference.api import InferenceEngine, WeightSource
from core.models import load_tokenizer
from core.rollout.api import Group, Workflow, derive_seed, workflow_class
from core.rollout.executor import RolloutExecutor
from core.runtime.draw_ledger import DrawLedger
from core.storage import fetch_dir

logger = logging.getLogger(__name__)
T = TypeVar("T")


def build_workflow(config: Config, tokenizer: Any) -> Workflow:
    """Instantiate ``rollout.workflow`` (an import path to a class with ``from_config``)."""
    return workflow_class(config.rollout.workflow).from_config(config, tokenizer)


def build_engine(config: Config, model_dir: str, version: int = 0) -> InferenceEngine:
    """Our in-process engine holding ``model_dir`` as ``version``, or a client for servers (which
    :class:`RolloutWorker` brings to ``model_dir`` at ``version`` before the first rollout)."""
    r = config.inference
    if r.engine == "hf":
        from core.inference.engine.hf_engine import HFEngine

        return HFEngine.from_pretrained(
            model_dir, dtype=config.model.dtype, max_batch_size=r.max_batch_rows or config.rollout.max_concurrent,
            seed=config.experiment.seed, attn_implementation=config.model.attn_implementation,
            prefix_cache_tokens=r.prefix_cache_tokens, version=version,
            keep_kv_on_update=r.kv_after_update == "keep",
        )  # fmt: skip
    if r.engine == "sglang":
        from core.inference.clients.sglang_client import SGLangClient

        # servers the run launched with priority scheduling take each call's group order
        send = bool(r.max_batch_rows)
        return SGLangClient(list(r.server_addresses), version=version, send_priority=send)
    from core.inference.clients.vllm_client import VLLMClient

    return VLLMClient(list(r.server_addresses), model_name=config.model.path, version=version)


class RolloutWorker:
    """Engine, workflow and executor on a private event loop; synchronous methods for the driver."""

    def __init__(
        self,
        config: Config,
        model_dir: str,
        train: list[dict],
        *,
        version: int = 0,
        state: dict[str, Any] | None = None,
        weights_url: str | None = None,
    ) -> None:
        """``model_dir``: the starting policy (a local HF folder); servers are sent
        ``weights_url`` instead where given (the same weights, at a URL every node can read)."""
        torch.set_num_threads(max(1, config.scheduler.torch_threads))
        model_dir = fetch_dir(model_dir)  # a URL on a node without the driver's disk
        self.config = config
        self.tokenizer = load_tokenizer(config.model.tokenizer_path or model_dir)
        self.loader = ResumableDataLoader(
            train, batch_size=1, shuffle=True, seed=config.experiment.seed
        )
        # Draws not yet consumed are drawn again on resume; the ones trained after them are not.
        self.draws = DrawLedger.restore(self.loader, state)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rollout-loop", daemon=True
        )
        self._thread.start()
        self.engine = build_engine(config, model_dir, version)
        if config.inference.engine != "hf":  # servers serve the run's starting weights first
            start = WeightSource(path=weights_url or model_dir)
            self._run(self.engine.start_from(start, version))
        self.workflow = build_workflow(config, self.tokenizer)
        algo = config.algorithm
        group_filter = (lambda g: len(set(g.rewards)) > 1) if algo.dynamic_sampling else None
        self.executor = self._run(self._make_executor(group_filter))
        if version or state:
            self.executor.recover(version, state.get("counters") if state else None)
        # Rollouts start with the first batch asked for, not here: nothing is generated while
        # the run's starting eval holds the clock (it would be work the throughput never timed).
        self._started = False

    async def _make_executor(self, group_filter: Any) -> RolloutExecutor:
        c = self.config
        return RolloutExecutor(
            self.engine, self.workflow, batch_size=c.rollout.batch_size, group_size=c.algorithm.group_size,
            max_staleness=c.rollout.max_staleness, max_concurrent=c.rollout.max_concurrent,
            adaptive_staleness=c.rollout.adaptive_staleness,
            max_failure_rate=c.rollout.max_failure_rate, group_filter=group_filter,
            max_filtered_in_a_row=c.rollout.max_filtered_in_a_row,
            episode_timeout_s=c.rollout.episode_timeout_s,
        )  # fmt: skip

    def _next_sample(self) -> dict[str, Any]:
        draw = self.draws.draw()
        # The draw's place in the data stream seeds its sampling: the same on resume, and
        # reproducible by anyone who draws from the same loader (experiments/reference_grpo.py).
        seed = derive_seed(self.config.experiment.seed, draw.epoch, draw.position)
        return {**draw.sample, "_draw": draw.index, "seed": seed}

    # ------------------------------------------------------------------ driver API
    def prepare_batch(self, timeout_s: float | None = None) -> list[Group]:
        """Block until a batch of groups within the staleness bound is ready; take it. The
        first call starts the rollouts."""
        if not self._started:
            self._started = True
            self._call_soon(self.executor.start, self._next_sample)
        return self._run(self.executor.prepare_batch(timeout_s, self.config.rollout.stall_warn_s))

    def update_weights(self, path: str, version: int) -> float:
        """Pause submission → pause engine (in-flight requests abort) → load → resume. Seconds taken."""
        start = time.perf_counter()
        # Our engine reads local folders (a URL is fetched here, then dropped); servers fetch.
        local = fetch_dir(path) if self.config.inference.engine == "hf" else path
        try:
            self._run(self._update(WeightSource(path=local), version))
        finally:
            if local != path:
                shutil.rmtree(local, ignore_errors=True)
        return time.perf_counter() - start

    def init_weight_group(
        self, master_address: str, master_port: int, name: str, backend: str
    ) -> None:
        """The servers join the learner's weight group (inference.weight_sync=distributed)."""
        self._run(self.engine.init_weight_group(master_address, master_port, name, backend))

    def restore_servers(self, addresses: list[str]) -> None:
        """Route to these servers again: restarted, at the current version."""
        self._call_soon(self.engine.restore, addresses)

    def destroy_weight_group(self, name: str) -> None:
        self._run(self.engine.destroy_weight_group(name))

    def update_weights_distributed(
        self, metadata: dict[str, list], version: int, name: str
    ) -> float:
        """As :meth:`update_weights`, the tensors coming by broadcast from the learner's rank 0
        (which the driver starts at the same time). Seconds taken."""
        start = time.perf_counter()
        self._run(
            self._swap(self.engine.update_weights_distributed(metadata, version, name), version)
        )
        return time.perf_counter() - start

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs: the dataloader position from before the oldest draw not yet
        consumed, the draws after it already settled (``skip_draws``, see
        :mod:`core.runtime.draw_ledger`), and the executor's counters.

        The ready buffer is not saved: its groups, like the ones in flight, are drawn and
        generated again after a resume. Their sampling seeds are the same, so they come out
        as an uninterrupted run would have sampled them, but under the checkpoint's weights
        (newer than the ones they were first generated with, so no staler).
        """
        return self._run(self._state())

    def stats(self) -> dict[str, Any]:
        """The executor's counters, and the in-process engine's (``engine``) where it has them."""
        out = {"version": self.executor.version, **self.executor.counters.as_dict()}
        engine_stats = getattr(self.engine, "stats", None)
        if hasattr(engine_stats, "as_dict"):
            out["engine"] = engine_stats.as_dict()  # type: ignore[union-attr]
        return out

    def evaluate(self, samples: list[dict]) -> dict[str, Any]:
        """Held-out accuracy on ``samples`` through the engine (current weights), as
        ``eval.*`` configures it."""
        return self._run(self._evaluate(samples))

    def close(self) -> None:
        self._run(self.executor.stop())
        for part in (self.workflow, self.engine):  # the workflow's verifier processes, the engine
            aclose = getattr(part, "aclose", None)  # an HTTP client's session
            if aclose is not None:
                self._run(aclose())
            close = getattr(part, "close", None)
            if close is not None:
                close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ internals
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _call_soon(self, fn: Any, *args: Any) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    async def _update(self, source: WeightSource, version: int) -> None:
        await self._swap(self.engine.update_weights(source, version), version)

    async def _swap(self, load: Coroutine[Any, Any, None], version: int) -> None:
        """Pause submission → pause engine → ``load`` → resume.

        In-flight requests abort and their agents resubmit them (AReaL's interruptible
        generation), except on our in-process engine with ``inference.kv_after_update=keep``: they
        stay in its batch and go on decoding on their KV cache under the new weights (PipelineRL),
        instead of each prefilling its whole conversation again (at 512 episodes in flight that
        re-prefill took most of the engine's time).
        """
        self.executor.pause()
        r = self.config.inference
        if r.engine == "hf" and r.kv_after_update == "keep":
            await self.engine.pause("hold")  # type: ignore[call-arg]
        else:
            await self.engine.pause()
        await load
        self.executor.set_version(version)
        await self.engine.resume()
        self.executor.resume()

    async def _state(self) -> dict[str, Any]:
        # on the loop: no draw is made, consumed or finished while the state is read
        live = [sample["_draw"] for sample in self.executor.outstanding_samples()]
        return {**self.draws.state_dict(live), "counters": self.executor.counters.as_dict()}

    async def _evaluate(self, samples: list[dict]) -> dict[str, Any]:
        # No new rollouts start during an eval: the trainer leaves its time out of the RL clock,
        # and rollouts made meanwhile would count as trained samples without their time.
        # (Episodes already running go on; the engine serves both.)
        self.executor.pause()
        try:
            settings = eval_settings(self.config)
            result = await evaluate_workflow(self.engine, self.workflow, samples, **settings)
        finally:
            self.executor.resume()
        return result.to_dict()
