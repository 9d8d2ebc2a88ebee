"""A verifiers environment written in that package's own API, over our word problems.

``data.verifiers.env=core.workflows.verifiers_example`` (experiments/verifiers.yaml): what a
user's environment module looks like — a ``load_environment(**env_args)`` returning a
``verifiers.Environment`` with its dataset, parser and rubric. ``turns=1`` is a
``SingleTurnEnv``; ``turns=2`` a ``MultiTurnEnv`` that asks the model to check its answer and
give it again, scoring the last one.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

from core.data.synthetic import SyntheticSpec, generate_splits
from core.rewards.gsm8k import gsm8k_reward

SYSTEM_PROMPT = "Solve the problem. End with #### and the answer."
CHECK = "Check your working and give the answer again, ending with #### and the answer."


def correct_answer(completion: list[dict[str, Any]], answer: str, **_: Any) -> float:
    """A rubric function: 1.0 when the last reply's answer is the reference solution's."""
    replies = [m.get("content") or "" for m in completion if m["role"] == "assistant"]
    return gsm8k_reward(replies[-1], answer) if replies else 0.0


class CheckTwice(vf.MultiTurnEnv):
    """Two model turns: the answer, then (asked to check it) the answer again."""

    async def is_completed(self, messages: Any, state: dict[str, Any], **kwargs: Any) -> bool:
        return len(state["responses"]) >= 2

    async def env_response(
        self, messages: Any, state: dict[str, Any], **kwargs: Any
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        return [{"role": "user", "content": CHECK}], state


def load_environment(
    n_train: int = 4000, n_test: int = 200, seed: int = 0, turns: int = 1
) -> vf.Environment:
    """Word problems (the math quickstart's generator) as a verifiers environment."""
    if turns not in (1, 2):
        raise ValueError(f"turns={turns}: this environment plays 1 or 2 turns")
    # the math quickstart's problems and solution mix: half answer directly ("#### 6"), half work
    spec = SyntheticSpec(min_steps=1, max_steps=2, max_operand=10, operations=["+", "-", "*"],
                         max_multiplier=3, direct_fraction=0.5, worked_phrasings=2)  # fmt: skip
    train, test = generate_splits(spec, n_train, n_test, seed)

    def rows(samples: list[dict]) -> Dataset:
        return Dataset.from_list([
            {"question": s["question"], "answer": s["answer"]}  # a solution ending "#### N"
            for s in samples
        ])  # fmt: skip

    kind = vf.SingleTurnEnv if turns == 1 else CheckTwice
    return kind(
        dataset=rows(train), eval_dataset=rows(test), system_prompt=SYSTEM_PROMPT,
        rubric=vf.Rubric(funcs=[correct_answer], weights=[1.0]),
    )  # fmt: skip
