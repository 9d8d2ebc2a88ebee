"""Customer-service episodes (``data.source=customer_service``): seeded order desks and goals for
:mod:`core.workflows.support_env`, each training one with a scripted agent's solved
conversation for SFT.

A sample::

    {"id": "cs-train-0", "question": the customer's opening ("I want a refund for order 417."),
     "answer": the desk as JSON (orders and the hidden goal: what the agent plays against),
     "task": the goal's kind (status | refund | address: evaluation reports accuracy/<task>),
     "tools": the tool schemas the agent shows the model ([] with show_tools=false),
     "sft_messages": a solved conversation, training samples only,
     "rl_only": true on a training sample with no SFT conversation (see below)}

The scripted agent (:func:`solved_conversation`) asks for the order number when the customer
did not give it, looks the order up, then acts or declines as the policy says and tells the
customer. With ``direct_fraction`` it instead acts at once, without looking, on that share of
refund and address requests; such a conversation is kept for SFT only where acting blind
happened to be allowed. SFT on that mix learns to act blind often: where the order turns out
not to be eligible the action is forbidden and the episode earns 0, which RL can discover —
the same lever as the math quickstart's direct answers. A desk where acting blind was forbidden
stays in the training split as an RL-only row (``rl_only``: no SFT conversation), so RL meets
ineligible orders as often as held-out customers bring them; dropping those desks would leave
RL a training set where acting blind is nearly always allowed, and nothing to discover.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from core.data.sources import DataSection, Splits, data_source
from core.data.splits import fresh_episodes
from core.schema import documented
from core.workflows.support_env import (
    CITIES,
    ELIGIBLE,
    GOALS,
    ITEMS,
    STATUSES,
    TOOLS,
    Customer,
    Desk,
    Goal,
    Order,
)


@dataclass
class SupportSpec:
    """The generated customers: their goals, orders and how the SFT conversations solve them."""

    goals: list[str] = documented(
        help=f"The customers' goals to draw from, uniformly: any of {list(GOALS)}.",
        factory=lambda: list(GOALS),
    )
    n_orders: int = documented(
        2, "Orders per customer (the goal's order and others the agent must not touch).",
        ge=1, le=9,
    )  # fmt: skip
    id_digits: int = documented(
        3,
        "Digits of an order number. Measured with the tiny preset: with show_tools=false it "
        "learned to copy a one-digit number from the customer's words into its tool calls within "
        "800 SFT steps; with the schemas shown it copied neither one digit (800 steps) nor three "
        "(1,800 steps).",
        ge=1, le=6,
    )  # fmt: skip
    show_tools: bool = documented(
        True,
        "List the tools' schemas in the system turn (the chat template's <tools> block), as a "
        "pretrained model needs. A from-scratch preset learns the calls from SFT, cannot read "
        "schemas, and pays ~190 tokens per completion for them.",
    )
    eligible_fraction: float = documented(
        0.5,
        "Share of refund and address requests the policy allows (the order is delivered, "
        "resp. still processing); the others must be declined.",
        ge=0.0, le=1.0,
    )  # fmt: skip
    withhold_id_fraction: float = documented(
        0.3,
        "Share of customers who do not name their order at first: the agent must ask for it.",
        ge=0.0, le=1.0,
    )  # fmt: skip
    direct_fraction: float = documented(
        0.0,
        "Share of the SFT conversations for refund and address requests in which the scripted "
        "agent acts without looking the order up (kept for SFT only where that was allowed; "
        "the others are RL-only rows): a warm start that acts blind, which RL can improve on.",
        ge=0.0, le=1.0,
    )  # fmt: skip


def spec_problems(spec: SupportSpec) -> list[str]:
    """What is wrong with ``spec`` ([] = nothing), each naming its field."""
    unknown = [goal for goal in spec.goals if goal not in GOALS]
    if unknown or not spec.goals:
        return [f"data.customer_service.goals={spec.goals}: pick one or more of {list(GOALS)}"]
    return []


def draw_desk(rng: random.Random, spec: SupportSpec) -> Desk:
    """One customer: ``n_orders`` orders (distinct ids) and a goal about one of them."""
    low = 10 ** (spec.id_digits - 1) if spec.id_digits > 1 else 1
    ids = rng.sample(range(low, 10**spec.id_digits), spec.n_orders)
    orders = {
        str(number): Order(rng.choice(ITEMS), rng.choice(STATUSES), rng.choice(CITIES))
        for number in ids
    }
    order_id = rng.choice(sorted(orders))
    kind = rng.choice(spec.goals)
    order = orders[order_id]
    if kind in ELIGIBLE:  # allowed or not, as eligible_fraction says
        allowed = rng.random() < spec.eligible_fraction
        others = [s for s in STATUSES if s != ELIGIBLE[kind]]
        order.status = ELIGIBLE[kind] if allowed else rng.choice(others)
    city = rng.choice([c for c in CITIES if c != order.city]) if kind == "address" else ""
    goal = Goal(kind, order_id, city, gives_id=rng.random() >= spec.withhold_id_fraction)
    return Desk(orders, goal)


def _tool_turns(desk: Desk, k: int, name: str, **arguments: str) -> list[dict[str, Any]]:
    call = {"id": f"call_{k}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip
    result = desk.run_tool(name, json.dumps(arguments))
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result}]  # fmt: skip


def solved_conversation(desk: Desk, direct: bool = False) -> list[dict[str, Any]]:
    """The scripted agent's turns (assistant, tool and the customer's) after the opening, played
    against ``desk`` (changed as the tools change it); [] where it did not meet the goal without
    a forbidden action (``direct`` on a request the policy forbids)."""
    goal, customer = desk.goal, Customer(desk)
    messages: list[dict[str, Any]] = []

    def say(text: str) -> None:
        messages.append({"role": "assistant", "content": text})
        answer = customer.answer(text)
        if answer is not None:
            messages.append({"role": "user", "content": answer})

    if not goal.gives_id:
        say("What is your order number?")
    oid = goal.order_id
    if not (direct and goal.kind in ELIGIBLE):
        messages += _tool_turns(desk, len(messages), "lookup_order", order_id=oid)
    status = desk.orders[oid].status
    if goal.kind == "status":
        say(f"Order {oid} is {status}.")
    elif goal.kind in ELIGIBLE and not direct and status != ELIGIBLE[goal.kind]:
        what = "refund it" if goal.kind == "refund" else "change its address"
        say(f"Order {oid} is {status}, so I cannot {what}.")
    elif goal.kind == "refund":
        messages += _tool_turns(desk, len(messages), "refund", order_id=oid)
        say(f"Order {oid} is refunded.")
    else:
        messages += _tool_turns(desk, len(messages), "change_address", order_id=oid,
                                city=goal.city)  # fmt: skip
        say(f"Order {oid} now goes to {goal.city}.")
    return messages if customer.reward() == 1.0 else []


def _episodes(spec: SupportSpec, seed: int, split: str) -> Iterator[dict[str, Any]]:
    rng = random.Random(f"customer-service-{seed}-{split}")
    index = 0
    while True:
        desk = draw_desk(rng, spec)
        sample = {"id": f"cs-{split}-{index}", "question": desk.goal.opening,
                  "answer": desk.to_json(), "task": desk.goal.kind,
                  "tools": copy.deepcopy(TOOLS) if spec.show_tools else []}  # fmt: skip
        index += 1
        if split == "train":
            direct = desk.goal.kind in ELIGIBLE and rng.random() < spec.direct_fraction
            messages = solved_conversation(Desk.from_json(sample["answer"]), direct)
            if messages:
                sample["sft_messages"] = messages
            else:  # acting blind was forbidden here: RL meets this customer, SFT does not
                sample["rl_only"] = True
        yield sample


def support_splits(spec: SupportSpec, n_train: int, n_test: int, seed: int) -> Splits:
    """``n_train`` training episodes and ``n_test`` held-out ones, none repeating a
    training episode (the same opening against the same desk)."""
    train, test = fresh_episodes(
        lambda split: _episodes(spec, seed, split),
        n_train,
        n_test,
        "widen data.customer_service (goals, n_orders)",
    )
    return Splits(train, test)


@data_source("customer_service", generated=True, version=2,
             check=lambda data: spec_problems(data.customer_service))  # fmt: skip
def customer_service(data: DataSection, seed: int) -> Splits:
    """Seeded customer-service episodes: ``n_train`` to train on, ``n_test`` held out."""
    return support_splits(data.customer_service, data.n_train, data.n_test, seed)
