"""The customer-service dialogue: the desk's tools and policy, the simulated customer, seeded
episodes with solved SFT conversations, the agent against a scripted model, bad specs, and an
end-to-end run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from core.config import ConfigError, load_config
from core.data.sources import resolve_source
from core.rollout.api import episode_metrics
from core.runtime.sft import sft_rows
from core.workflows.openai_agent import AgentEpisode
from core.workflows.support_agent import serve
from core.workflows.support_data import SupportSpec, solved_conversation, support_splits
from core.workflows.support_env import TOOLS, Customer, Desk, Goal, Order, goal_met
from tests.core.workflows.helpers import ReplayClient, two_step_run, two_trained_steps

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "customer_service.yaml"


def _desk(kind: str, status: str, *, gives_id: bool = True) -> Desk:
    orders = {"417": Order("lamp", status, "Oslo"), "200": Order("mug", "delivered", "Rome")}
    return Desk(orders, Goal(kind, "417", "Lima" if kind == "address" else "", gives_id))


def test_the_tools_read_and_change_orders_and_the_desk_records_forbidden_actions() -> None:
    desk = _desk("refund", "delivered")
    assert desk.run_tool("lookup_order", '{"order_id": "417"}') == "417: lamp, delivered, to Oslo"
    assert desk.run_tool("lookup_order", '{"order_id": "999"}') == "error: no order '999'"
    assert desk.run_tool("refund", "no") == "error: refund arguments are not JSON: 'no'"
    assert desk.run_tool("cancel", '{"order_id": "417"}').startswith("error: unknown tool")
    assert desk.run_tool("refund", '{"order_id": "417"}') == "417 refunded"
    assert desk.forbidden == [] and desk.orders["417"].status == "refunded"
    # the tools do not enforce the policy: the desk records each breach
    desk.run_tool("change_address", '{"order_id": "200", "city": "Lima"}')
    assert desk.forbidden == ["change_address on 200, not the customer's order",
                              "address change of a delivered order"]  # fmt: skip
    shipped = _desk("refund", "shipped")
    shipped.run_tool("refund", '{"order_id": "417"}')
    assert shipped.forbidden == ["refund of a shipped order"]
    restored = Desk.from_json(shipped.to_json())  # the state, not its history
    assert (restored.orders, restored.goal) == (shipped.orders, shipped.goal)


@pytest.mark.parametrize(
    ("kind", "status", "act", "reply", "met"),
    [
        ("status", "shipped", None, "Order 417 is shipped.", True),
        ("status", "shipped", None, "Order 417 is shipped or delivered.", False),  # hedged
        ("status", "shipped", None, "Order 417 is processing.", False),
        ("refund", "delivered", ("refund", {}), "Done.", True),
        ("refund", "delivered", None, "Sorry, I cannot refund it.", False),  # it was allowed
        ("refund", "shipped", None, "It is shipped, so I cannot refund it.", True),
        ("address", "processing", ("change_address", {"city": "Lima"}), "Done.", True),
        ("address", "processing", ("change_address", {"city": "Rome"}), "Done.", False),
        ("address", "delivered", None, "I cannot change it.", True),
    ],
)  # fmt: skip
def test_the_goal_is_met_by_the_right_outcome_or_a_refusal_only_where_the_policy_forbids(
    kind: str, status: str, act: tuple[str, dict] | None, reply: str, met: bool
) -> None:
    desk = _desk(kind, status)
    start = Order(**vars(desk.orders["417"]))
    if act is not None:
        desk.run_tool(act[0], json.dumps({"order_id": "417", **act[1]}))
    assert goal_met(desk, start, reply) is met


def test_the_customer_gives_their_order_number_when_asked_and_leaves_with_an_answer() -> None:
    customer = Customer(_desk("status", "delivered", gives_id=False))
    assert customer.answer("What is your order number?") == "It is 417."
    assert customer.answer("Hello?") == "That does not help. Where is my order 417?"
    assert customer.answer("Order 417 is delivered.") is None
    assert customer.satisfied and customer.reward() == 1.0
    guessed = Customer(_desk("status", "delivered"))  # one guess: a wrong status ends it
    assert guessed.answer("Order 417 is shipped.") is None and guessed.reward() == 0.0
    refused = Customer(_desk("refund", "delivered"))  # so does refusing an allowed request
    assert refused.answer("I cannot refund it.") is None and not refused.satisfied
    blind = _desk("refund", "processing")
    blind.run_tool("refund", '{"order_id": "417"}')
    rude = Customer(blind)
    assert rude.answer("Refunded.") is not None and rude.reward() == 0.0


def test_episodes_are_seeded_and_held_out_episodes_are_new() -> None:
    spec = SupportSpec(direct_fraction=0.5)
    first, again, other = (support_splits(spec, 200, 50, seed) for seed in (1, 1, 2))
    assert first == again and first.train != other.train
    trained = {(s["question"], s["answer"]) for s in first.train}
    assert not trained & {(s["question"], s["answer"]) for s in first.test}
    assert {s["task"] for s in first.test} == {"status", "refund", "address"}
    assert all("sft_messages" not in s for s in first.test)
    assert any(not json.loads(s["answer"])["goal"]["gives_id"] for s in first.train)


def _first_call(sample: dict[str, Any]) -> str | None:
    calls = [m["tool_calls"][0]["function"]["name"] for m in sample["sft_messages"]
             if m.get("tool_calls")]  # fmt: skip
    return calls[0] if calls else None


@pytest.mark.parametrize("direct_fraction", [0.0, 0.8])
def test_every_sft_conversation_is_solved_and_acts_blind_only_where_that_was_allowed(
    direct_fraction: float,
) -> None:
    train = support_splits(SupportSpec(direct_fraction=direct_fraction), 300, 1, 5).train
    rl_only = [s for s in train if s.get("rl_only")]
    sft = sft_rows(train)  # what SFT trains on: every row with a conversation, no other
    assert len(sft) + len(rl_only) == len(train) and all("sft_messages" in s for s in sft)
    blind = [s for s in sft if _first_call(s) != "lookup_order"]
    for sample in sft:  # replayed against a fresh desk, each is solved
        assert solved_conversation(Desk.from_json(sample["answer"]), sample in blind)
    for sample in blind:
        assert _status(sample) in ("delivered", "processing") and sample["task"] != "status"
    for sample in rl_only:  # acting blind was forbidden: RL meets it, SFT has nothing to imitate
        assert "sft_messages" not in sample and sample["task"] != "status"
        assert not _eligible(sample)
        assert not solved_conversation(Desk.from_json(sample["answer"]), direct=True)
    requests = [s for s in sft if s["task"] != "status"]
    ineligible = [s for s in train if s["task"] != "status" and not _eligible(s)]
    if direct_fraction == 0.0:
        assert not blind and not rl_only
    else:  # a warm start that mostly acts blind: d / (2 - d) of the SFT requests
        assert 0.55 < len(blind) / len(requests) < 0.8
    # RL meets ineligible orders as often as held-out customers bring them (about half)
    assert 0.35 < len(ineligible) / len([s for s in train if s["task"] != "status"]) < 0.65


def _status(sample: dict[str, Any]) -> str:
    desk = json.loads(sample["answer"])
    return desk["orders"][desk["goal"]["order_id"]]["status"]


def _eligible(sample: dict[str, Any]) -> bool:
    return _status(sample) == {"refund": "delivered", "address": "processing"}[sample["task"]]


def _episode(
    sample: dict[str, Any], turns: list[dict[str, Any]], max_turns: int = 6
) -> AgentEpisode:
    opening = [{"role": "user", "content": sample["question"]}]
    return AgentEpisode(client=ReplayClient(turns), sample=sample, messages=opening,  # type: ignore[arg-type]
                        max_turns=max_turns)  # fmt: skip


def test_the_agent_replaying_a_solved_conversation_is_rewarded_and_reports_its_metrics() -> None:
    train = support_splits(SupportSpec(withhold_id_fraction=0.5), 40, 1, 3).train
    sample = next(s for s in train if s["task"] == "refund"
                  and not json.loads(s["answer"])["goal"]["gives_id"])  # fmt: skip
    turns = [m for m in sample["sft_messages"] if m["role"] == "assistant"]
    episode = _episode(sample, turns)
    assert asyncio.run(serve(episode)) == 1.0
    sent = episode.client.sent[-1]  # type: ignore[attr-defined]
    # the tool results and the customer's answers are the SFT conversation's own
    assert [m["content"] for m in sent if isinstance(m, dict)][1:] == [
        m["content"] for m in sample["sft_messages"][:-1] if m["role"] != "assistant"
    ]
    assert episode.info["tool_calls"] == len(turns) - 2 and episode.info["outcome"] == "met"
    assert episode.client.tools == [TOOLS] * len(turns)  # type: ignore[attr-defined]
    assert episode_metrics([episode.info]) == {"forbidden": 0.0, "goal_met": 1.0,
                                               "looked_up_first": 1.0}  # fmt: skip


def test_without_show_tools_no_schema_is_listed_in_sft_or_in_the_agents_calls() -> None:
    spec = SupportSpec(show_tools=False, id_digits=1)
    split = support_splits(spec, 20, 5, 2)
    assert all(s["tools"] == [] for s in split.train + split.test)
    assert all(len(k) == 1 for s in split.train for k in json.loads(s["answer"])["orders"])
    sample = split.train[0]
    turns = [m for m in sample["sft_messages"] if m["role"] == "assistant"]
    episode = _episode(sample, turns)
    assert asyncio.run(serve(episode)) == 1.0
    assert episode.client.tools == [None] * len(turns)  # type: ignore[attr-defined]


def test_an_agent_that_refunds_blind_an_undelivered_order_earns_nothing() -> None:
    desk = _desk("refund", "shipped")
    sample = {"id": "x", "question": desk.goal.opening, "answer": desk.to_json()}
    call = {"id": "c", "type": "function",
            "function": {"name": "refund", "arguments": {"order_id": "417"}}}  # fmt: skip
    turns = [{"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "assistant", "content": "Order 417 is refunded."}]  # fmt: skip
    episode = _episode(sample, turns, max_turns=2)
    assert asyncio.run(serve(episode)) == 0.0
    assert episode.info["outcome"] == "refund of a shipped order"
    assert episode_metrics([episode.info])["forbidden"] == 1.0
    # out of turns before the customer is satisfied: nothing either
    quiet = _episode(sample, [{"role": "assistant", "content": "Hello."}], max_turns=1)
    assert asyncio.run(serve(quiet)) == 0.0 and quiet.info["outcome"] == "unmet"


def test_a_bad_goal_fails_when_the_config_loads_naming_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"data.customer_service.goals=\['refnd'\]: pick one "
                       r"or more of \['status', 'refund', 'address'\]"):  # fmt: skip
        load_config(RECIPE, ["data.customer_service.goals=[refnd]"])
    with pytest.raises(ConfigError, match="data.customer_service.direct_fraction"):
        load_config(RECIPE, ["data.customer_service.direct_fraction=1.5"])
    cfg = load_config(RECIPE, ["data.n_train=8", "data.n_test=2"])
    assert len(resolve_source("customer_service").fn(cfg.data, 1).train) == 8


@pytest.mark.e2e
def test_an_agent_serves_customers_end_to_end(harness: str, tmp_path: Path) -> None:
    run_dir, summary = two_step_run(RECIPE, tmp_path)
    two_trained_steps(run_dir, summary, n_test=4)
    reported = set(summary["evals"][-1]["metrics"])
    assert {"goal_met", "forbidden", "looked_up_first"} <= reported
    assert "direct_share" not in reported  # the agent scores itself: no reward_fn metric
    metrics = [json.loads(line) for line in
               (run_dir / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    assert any("agent/forbidden" in m for m in metrics)
