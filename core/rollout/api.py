"""Rollout contracts: a trajectory, a group of them, and the workflow that produces one.

A *workflow* turns one dataset sample into one episode by talking to an inference engine
(single-turn generation, or a multi-turn agent with tools). An episode is trained as one
trajectory, or as several (an agent's calls one by one: ``agent.trajectory_mode=per_turn``)
that share its reward. The executor runs ``group_size`` episodes per prompt and hands complete
groups to the learner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from core.inference.api import InferenceEngine, SamplingParams
from core.plugins import load_object


@dataclass
class Trajectory:
    """One episode as the learner sees it: a token sequence with per-token training data.

    ``input_ids`` is prompt + everything after it (model output and, for agents, tool results).
    ``loss_mask`` is 1 on tokens the policy generated and 0 on prompt and tool tokens.
    ``logprobs`` are the behaviour policy's (the engine's) logprobs, 0 where ``loss_mask`` is 0.
    ``versions`` are the weight versions that generated each token, -1 where not generated.
    ``call_lengths`` are the tokens each generation call with its own ``max_new_tokens`` budget
    generated, in order (an OpenAI-shaped agent's completion calls); None = the row's generated
    tokens share one budget (single-turn RLVR, the tagged-tool agent). DAPO's overlong penalty
    compares each call with the budget, not the row's total.
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float
    prompt_len: int
    metadata: dict[str, Any] = field(default_factory=dict)
    call_lengths: list[int] | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        assert len(self.loss_mask) == len(self.logprobs) == len(self.versions) == n, (
            "ragged trajectory"
        )
        if self.call_lengths is not None:
            assert sum(self.call_lengths) == self.n_generated, "call_lengths != generated tokens"

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int:
        """The version of the oldest generated token (staleness is measured from it)."""
        generated = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(generated) if generated else -1


@dataclass
class Group:
    """``group_size`` episodes sampled from the same prompt (GRPO's unit).

    ``trajectories`` are the rows to train, in episode order; ``episode_of[i]`` is the episode
    (``0 .. n_episodes - 1``) row ``i`` belongs to. Most workflows give one row per episode.
    """

    sample_id: str
    trajectories: list[Trajectory]
    submitted_version: int
    sample: dict[str, Any] = field(default_factory=dict)  # the dataset row it came from
    episode_of: list[int] = field(default_factory=list)  # empty: one row per episode

    def __post_init__(self) -> None:
        if not self.episode_of:
            self.episode_of = list(range(len(self.trajectories)))
        if len(self.episode_of) != len(self.trajectories):
            raise ValueError("Group.episode_of needs one episode index per trajectory")

    @classmethod
    def of_episodes(
        cls, sample_id: str, episodes: list[list[Trajectory]], submitted_version: int, **kw: Any
    ) -> Group:
        """A group from each episode's rows (see :func:`episode_rows`)."""
        rows = [t for episode in episodes for t in episode]
        owners = [i for i, episode in enumerate(episodes) for _ in episode]
        return cls(sample_id, rows, submitted_version, episode_of=owners, **kw)

    @property
    def n_episodes(self) -> int:
        return self.episode_of[-1] + 1 if self.episode_of else 0

    @property
    def rewards(self) -> list[float]:
        """One reward per episode (its rows share it)."""
        reward = {e: t.reward for e, t in zip(self.episode_of, self.trajectories, strict=True)}
        return [reward[e] for e in range(self.n_episodes)]

    @property
    def oldest_version(self) -> int:
        versions = [t.oldest_version for t in self.trajectories if t.n_generated]
        return min(versions) if versions else self.submitted_version


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts``, the same in every process and on every machine.

    Sampling seeds flow down: the run's seed and a prompt's draw give the prompt's seed
    (``sample["seed"]``); that and an episode's index in its group give the episode's.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def episode_sample(sample: dict[str, Any], index: int) -> dict[str, Any]:
    """The sample episode ``index`` of a group runs on: with its own seed when the prompt has one."""
    if "seed" not in sample:
        return sample
    return {**sample, "seed": derive_seed(sample["seed"], index)}


def episode_rows(result: Trajectory | list[Trajectory] | None) -> list[Trajectory] | None:
    """What ``Workflow.run_episode`` returned, as the episode's rows (None: rejected)."""
    if result is None:
        return None
    rows = [result] if isinstance(result, Trajectory) else list(result)
    if not rows:
        raise ValueError(
            "a workflow returned an episode with no trajectory (return None to reject)"
        )
    if not all(isinstance(t, Trajectory) for t in rows):
        kinds = sorted({type(t).__name__ for t in rows})
        raise ValueError(f"a workflow returned {kinds} for an episode: expected Trajectory rows")
    if len({t.reward for t in rows}) > 1:
        raise ValueError("an episode's trajectories must share its reward")
    return rows


@runtime_checkable
class Workflow(Protocol):
    """Produces one episode per call: a trajectory, or a list of them that share the episode's
    reward (an agent's calls trained one by one); ``None`` rejects the episode (it is counted,
    not trained on).

    ``sampling`` is how the workflow samples; held-out evals run a copy with greedy sampling.
    A ``sample`` may carry ``seed``: the workflow then samples every request of the episode with
    it (``SamplingParams.seed``), so the episode is reproducible whatever else runs beside it.
    """

    sampling: SamplingParams

    async def run_episode(
        self, engine: InferenceEngine, sample: dict[str, Any]
    ) -> Trajectory | list[Trajectory] | None: ...


def workflow_class(path: str) -> Any:
    """The workflow class named by ``path`` (``"module:Class"``), checked to have ``from_config``."""
    cls = load_object(path, "workflow")
    if not callable(getattr(cls, "from_config", None)):
        raise ValueError(f"workflow {path!r} has no from_config(config, tokenizer) to build it")
    return cls


def episode_metrics(metadata: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The mean of each ``metric/<name>`` number the episodes report (an agent's
    ``episode.info``), as ``<name>``, over the episodes that report it."""
    values: dict[str, list[float]] = {}
    for row in metadata:
        for key, value in row.items():
            if key.startswith("metric/") and isinstance(value, int | float):
                values.setdefault(key.removeprefix("metric/"), []).append(float(value))
    return {name: sum(v) / len(v) for name, v in sorted(values.items())}
