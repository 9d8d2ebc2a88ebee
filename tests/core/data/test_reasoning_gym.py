"""reasoning-gym: the package's tasks as a data source, its verifiers as the reward, bad specs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.data.reasoning_gym import ReasoningGymSpec, reasoning_gym_splits
from core.data.sources import resolve_source
from core.rewards.reasoning_gym import answer_text, answers_directly, score, solved

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "reasoning_gym.yaml"
THREE_TERMS = {"chain_sum": {"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2}}


def _answer(sample: dict) -> str:
    """The package's own answer to a sample's problem."""
    return json.loads(sample["answer"])["entry"]["answer"]


def _spec(**kwargs) -> ReasoningGymSpec:
    return ReasoningGymSpec(**{"tasks": ["chain_sum", "leg_counting"], **kwargs})


def test_the_same_seed_makes_the_same_problems_and_another_seed_others() -> None:
    train, test, _ = reasoning_gym_splits(_spec(), 60, 20, seed=3)
    again = reasoning_gym_splits(_spec(), 60, 20, seed=3)
    other = reasoning_gym_splits(_spec(), 60, 20, seed=4)
    assert (train, test) == again[:2]
    assert [s["question"] for s in test] != [s["question"] for s in other[1]]
    assert len(test) == 20 and [s["id"] for s in test[:2]] == ["rg-test-0", "rg-test-1"]


def test_held_out_questions_are_not_trained_on() -> None:
    # 1-digit sums of two terms repeat often: the overlap is real and removed
    spec = ReasoningGymSpec(
        tasks=["chain_sum"],
        task_config={"chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
    )
    train, test, overlap = reasoning_gym_splits(spec, 300, 50, seed=0)
    assert overlap > 0 and len(train) == 300 - overlap
    assert not {s["question"] for s in train} & {s["question"] for s in test}


def test_weights_and_task_config_reach_the_package() -> None:
    spec = _spec(weights=[1.0, 0.0], task_config=THREE_TERMS)
    train, test, _ = reasoning_gym_splits(spec, 30, 10, seed=1)
    assert {s["task"] for s in train + test} == {"chain_sum"}  # weight 0: never drawn
    for sample in train:
        expression = json.loads(sample["answer"])["entry"]["metadata"]["expression"]
        assert len(re.findall(r"\d+", expression)) == 3  # three 2-digit terms, as configured
        assert all(10 <= int(n) <= 99 for n in re.findall(r"\d+", expression))
    mixed, _, _ = reasoning_gym_splits(_spec(), 60, 10, seed=1)
    assert {s["task"] for s in mixed} == {"chain_sum", "leg_counting"}


def test_the_tasks_own_verifier_scores_the_answer() -> None:
    train, _, _ = reasoning_gym_splits(_spec(), 40, 10, seed=2)
    for sample in train:
        assert score(sample["solution"], sample["answer"]) == 1.0
        assert score(_answer(sample), sample["answer"]) == 1.0  # no tags: the whole completion
        assert score(f"<answer> {_answer(sample)} </answer>", sample["answer"]) == 1.0
        assert score("no idea", sample["answer"]) == 0.0
    wrong = next(s for s in train if s["task"] == "chain_sum")
    assert score(str(int(_answer(wrong)) + 1), wrong["answer"]) == 0.0
    assert answer_text("think... <answer>12</answer>") == "12"
    with pytest.raises(ValueError, match="task and entry"):
        score("1", '{"entry": {}}')


def test_solved_gives_no_credit_for_an_answer_that_only_contains_the_right_one() -> None:
    train, _, _ = reasoning_gym_splits(ReasoningGymSpec(tasks=["chain_sum"]), 20, 5, seed=2)
    sample = next(s for s in train if len(_answer(s)) == 1)
    padded = f"9{_answer(sample)}9"  # the right digit inside a wrong number
    assert score(padded, sample["answer"]) == pytest.approx(1 / 3)  # the package's partial credit
    assert solved(padded, sample["answer"]) == 0.0
    assert solved(_answer(sample), sample["answer"]) == 1.0


def test_worked_training_solutions_show_true_steps_and_score_full() -> None:
    """direct_fraction=0: every training solution of a task with a worked form shows its
    working, each step's arithmetic holds, and the task's verifier gives it full credit."""
    spec = _spec(direct_fraction=0.0, task_config={
        "chain_sum": {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2},
        "leg_counting": {"min_animals": 1, "max_animals": 3, "max_instances": 4},
    })  # fmt: skip
    train, test, _ = reasoning_gym_splits(spec, 120, 20, seed=5)
    for sample in train:
        working, answer = sample["solution"].split(" <answer>")
        assert answer == _answer(sample) + "</answer>"
        assert solved(sample["solution"], sample["answer"]) == 1.0
        for step in working.split(", "):
            left, result = step.rsplit(" = ", 1)
            left = re.sub(r"^\d+ [a-z ]+ \* ", lambda m: m.group(0).split()[0] + " * ", left)
            assert eval(left) == int(result), step  # noqa: S307 - digits and + - * only
    legs = next(
        s["solution"] for s in train if s["task"] == "leg_counting" and "+" in s["solution"]
    )
    assert re.fullmatch(r"(\d+ [a-z ]+ \* \d+ = \d+, )+[\d +]+ = \d+ <answer>\d+</answer>", legs)
    assert all(s["solution"].startswith("<answer>") for s in test)  # held out: the answer only


def test_direct_fraction_mixes_the_styles_and_changes_no_question() -> None:
    half, _, _ = reasoning_gym_splits(_spec(direct_fraction=0.5), 400, 10, seed=6)
    direct, _, _ = reasoning_gym_splits(_spec(), 400, 10, seed=6)  # the default: 1.0
    assert [s["question"] for s in half] == [s["question"] for s in direct]
    assert all(s["solution"].startswith("<answer>") for s in direct)
    share = sum(s["solution"].startswith("<answer>") for s in half) / len(half)
    assert 0.4 < share < 0.6
    assert answers_directly(" <answer>3</answer>") and not answers_directly("1 + 2 = 3")
    only_sums, _, _ = reasoning_gym_splits(
        _spec(direct_fraction=0.0, worked_tasks=["chain_sum"]), 100, 10, seed=6
    )
    assert {s["task"] for s in only_sums if not s["solution"].startswith("<answer>")} == {
        "chain_sum"
    }
    assert all(s["solution"].startswith("<answer>") for s in only_sums if s["task"] != "chain_sum")


def test_another_task_on_the_command_line_leaves_the_recipes_settings_unused() -> None:
    overrides = ["data.reasoning_gym.tasks=[basic_arithmetic]", "data.reasoning_gym.weights=[]"]
    cfg = load_config(RECIPE, overrides)  # the recipe's chain_sum/leg_counting settings stay
    train, _, _ = reasoning_gym_splits(cfg.data.reasoning_gym, 10, 5, seed=0)
    assert {s["task"] for s in train} == {"basic_arithmetic"}


def test_the_source_is_registered_and_generated() -> None:
    source = resolve_source("reasoning_gym")
    assert source.generated
    cfg = load_config(RECIPE, ["data.n_train=8", "data.n_test=4"])
    splits = source.fn(cfg.data, 0)
    assert len(splits.test) == 4 and "train_questions_in_test_removed" in splits.notes


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.reasoning_gym.tasks=[chain_sum,chain_summ]", r"unknown \['chain_summ'\]; available: .*'leg_counting'"),
        ("data.reasoning_gym.tasks=[]", r"tasks is empty; name at least one of .*'chain_sum'"),
        ("data.reasoning_gym.weights=[1.0]", r"weights=\[1.0\] needs one weight >= 0 per task"),
        ("data.reasoning_gym.weights=[0.0,0.0]", r"weights=\[0.0, 0.0\] needs one weight"),
        ("data.reasoning_gym.task_config.chain_sum.terms=3", r"task_config.chain_sum: unknown key\(s\) \['terms'\]; chain_sum takes \['min_terms'"),
        ("data.reasoning_gym.task_config.chain_sum.min_terms=0", r"task_config.chain_sum: min_terms must be positive"),
        ("data.reasoning_gym.task_config.chain_sum.seed=3", r"task_config.chain_sum: \['seed'\] come from data.seed"),
        ("data.reasoning_gym.direct_fraction=1.5", r"data.reasoning_gym.direct_fraction must be in \[0, 1\], got 1.5"),
        ("data.reasoning_gym.worked_tasks=[spell_backward]", r"worked_tasks: \['spell_backward'\] have no worked form; those with one: \['chain_sum', 'leg_counting'\]"),
        ("data.reasoning_gym.task_config.chain_sum=5", r"task_config.chain_sum=5 must map chain_sum's config keys"),
        ("data.reasoning_gym.task_config.spell_backwards.min_word_len=2", r"task_config names unknown task\(s\) \['spell_backwards'\]; available: .*'spell_backward'"),
        ("data.reasoning_gym.task_config.spell_backward.min_word_len=-2", r"task_config.spell_backward: "),
    ],
)  # fmt: skip
def test_a_bad_spec_fails_when_the_config_loads_naming_the_field(
    override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, [override])
