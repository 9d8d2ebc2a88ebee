"""A trained reward model as an RL reward: it scores the tokens of a prompt and its sampled
completion (the rollout's own ids: no re-tokenization), batched.

:class:`RewardModelScorer` lives in the rollout worker beside the workflow. Episodes finish one by
one; a call waits at most ``max_wait_s`` for others, and up to ``max_batch`` sequences share one
forward pass (in a worker thread, so generation goes on meanwhile). The score is the value model's
output at the sequence's last token (``core.models.value_model``), as the reward-model stage
trained it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from core.models.value_model import ValueModel, last_token_values
from core.storage import fetch_dir, join

logger = logging.getLogger(__name__)


class RewardModelScorer:
    """``await scorer(token_ids) -> float``, batched (see the module docstring)."""

    def __init__(self, path: str, *, max_batch: int = 64, max_wait_s: float = 0.005) -> None:
        self.path = path
        self.model = ValueModel.from_pretrained(path).eval()
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._waiting: list[tuple[list[int], asyncio.Future[float]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.n_calls = 0
        self.n_batches = 0

    async def __call__(self, token_ids: list[int]) -> float:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        self._waiting.append((list(token_ids), future))
        self.n_calls += 1
        if len(self._waiting) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = self._waiting, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._score(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _score(self, batch: list[tuple[list[int], asyncio.Future[float]]]) -> None:
        try:
            rewards = await asyncio.to_thread(self.score_batch, [ids for ids, _ in batch])
        except Exception as err:  # every waiting episode learns why, none hangs
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), reward in zip(batch, rewards, strict=True):
            if not future.done():
                future.set_result(reward)

    @torch.no_grad()
    def score_batch(self, sequences: list[list[int]]) -> list[float]:
        """One forward pass over right-padded ``sequences``; their rewards."""
        self.n_batches += 1
        width = max(len(s) for s in sequences)
        ids = torch.zeros((len(sequences), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        values = self.model(ids, mask)
        return last_token_values(values, mask).tolist()

    def stats(self) -> dict[str, Any]:
        return {"calls": self.n_calls, "batches": self.n_batches}


def reward_model_path(config: Any) -> str:
    """The folder RL scores with: ``reward_model.path``, else this run's reward-model stage."""
    return config.reward_model.path or join(config.run_dir, "reward_model")


def reward_model_from_config(config: Any) -> RewardModelScorer | None:
    """The scorer of ``reward_model.use_in_rl`` (None when off), its folder fetched to this
    node when it is remote."""
    if not config.reward_model.use_in_rl:
        return None
    return RewardModelScorer(fetch_dir(reward_model_path(config)))
