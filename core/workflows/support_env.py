"""A customer-service desk: one customer's orders, the agent's tools over them, the shop's policy,
and a rule-based simulated customer with a hidden goal.

An episode's state is the customer's orders (``{order_id: Order}``) and their :class:`Goal`:

    ``status``   "Where is my order 417?"          met when the agent tells them its status
    ``refund``   "I want a refund for order 417."  met by a refund, or by a refusal where the
                                                    policy forbids one
    ``address``  "Please send order 417 to Rome."  met by the change, or by a refusal where the
                                                    policy forbids it

The policy (the system prompt of experiments/customer_service.yaml says it): refund only
delivered orders; change the address only of orders still processing. As in tau-bench (Yao et
al., "τ-bench: A Benchmark for Tool-Agent-User Interaction in Real-World Domains", 2024) the
tools do not enforce it: ``refund`` refunds a shipped order if asked to, and the desk records
that as a **forbidden action**, as it does any change to an order other than the customer's.
An episode's reward is 1 when the goal is met without a forbidden action, else 0.

Tools (errors are results, never raises), offered as :data:`TOOLS` and run by
:meth:`Desk.run_tool` — the agent at rollout time and the scripted SFT conversations of
:mod:`core.workflows.support_data` both go through them::

    lookup_order(order_id)          -> "417: lamp, shipped, to Oslo"
    refund(order_id)                -> "417 refunded"
    change_address(order_id, city)  -> "417 now goes to Rome"

The customer (:class:`Customer`) reads each reply the agent sends them (a reply without tool
calls): satisfied, they leave and the episode ends; given a wrong status or a refusal of an
allowed request, they leave unsatisfied (one guess, not one per turn); asked for their order
number when they had not given it, they give it; otherwise they restate their request.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from core.inference.tool_calls import tool_arguments

GOALS = ("status", "refund", "address")
STATUSES = ("processing", "shipped", "delivered")  # "refunded" only after a refund
ELIGIBLE = {"refund": "delivered", "address": "processing"}  # the status the policy allows
ITEMS = ("lamp", "chair", "kettle", "desk", "mug", "shelf", "radio", "clock", "rug", "fan")
CITIES = ("Oslo", "Rome", "Lima", "Kyiv", "Riga", "Bern", "Doha", "Baku", "Pune", "Accra")
REFUSAL = "cannot"  # the word a reply that declines a request carries


@dataclass
class Order:
    item: str
    status: str
    city: str


@dataclass(frozen=True)
class Goal:
    """What the customer wants, and whether they name their order at first."""

    kind: str  # one of GOALS
    order_id: str
    city: str = ""  # address: where the order should go
    gives_id: bool = True  # False: the agent must ask for the order number

    @property
    def request(self) -> str:
        """The customer's request, naming the order."""
        return {
            "status": f"Where is my order {self.order_id}?",
            "refund": f"I want a refund for order {self.order_id}.",
            "address": f"Please send order {self.order_id} to {self.city}.",
        }[self.kind]

    @property
    def opening(self) -> str:
        """The customer's first message (the episode's question)."""
        if self.gives_id:
            return self.request
        return {
            "status": "Where is my order?",
            "refund": "I want a refund.",
            "address": f"Please send my order to {self.city}.",
        }[self.kind]


def _call(name: str, **arguments: str) -> dict[str, Any]:
    properties = {key: {"type": "string"} for key in arguments}
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": properties, "required": list(arguments)}}}  # fmt: skip


# Kept bare (no descriptions): every episode's system turn carries them, and the names say it.
TOOLS: list[dict[str, Any]] = [
    _call("lookup_order", order_id=""),
    _call("refund", order_id=""),
    _call("change_address", order_id="", city=""),
]


@dataclass
class Desk:
    """The customer's orders as the tools see and change them, and what the policy forbade."""

    orders: dict[str, Order]
    goal: Goal
    forbidden: list[str] = field(default_factory=list)  # the forbidden actions taken
    calls: list[str] = field(default_factory=list)  # tool names, in order

    @classmethod
    def from_json(cls, text: str) -> Desk:
        """The desk an episode starts from: a sample's ``answer`` (see :meth:`to_json`)."""
        state = json.loads(text)
        orders = {key: Order(**value) for key, value in state["orders"].items()}
        return cls(orders, Goal(**state["goal"]))

    def to_json(self) -> str:
        orders = {key: dataclasses.asdict(order) for key, order in self.orders.items()}
        return json.dumps({"orders": orders, "goal": dataclasses.asdict(self.goal)})

    def run_tool(self, name: str, arguments: str | None) -> str:
        """One tool call's result; a malformed call gets an error result."""
        parsed = tool_arguments(name, arguments)
        if isinstance(parsed, str):
            return parsed
        self.calls.append(name)
        order_id = str(parsed.get("order_id", ""))
        order = self.orders.get(order_id)
        if name not in ("lookup_order", "refund", "change_address"):
            return (
                f"error: unknown tool {name!r}; the tools are lookup_order, refund, change_address"
            )
        if order is None:
            return f"error: no order {order_id!r}"
        if name == "lookup_order":
            return f"{order_id}: {order.item}, {order.status}, to {order.city}"
        if order_id != self.goal.order_id:
            self.forbidden.append(f"{name} on {order_id}, not the customer's order")
        if name == "refund":
            if order.status != ELIGIBLE["refund"]:
                self.forbidden.append(f"refund of a {order.status} order")
            order.status = "refunded"
            return f"{order_id} refunded"
        city = str(parsed.get("city", ""))
        if order.status != ELIGIBLE["address"]:
            self.forbidden.append(f"address change of a {order.status} order")
        order.city = city
        return f"{order_id} now goes to {city}"


def goal_met(desk: Desk, start: Order, reply: str) -> bool:
    """Whether the customer's goal is met once the agent sent them ``reply``: ``start`` is their
    order as it was before the episode. A refusal counts only where the policy forbids the
    request and nothing was changed."""
    goal, order = desk.goal, desk.orders[desk.goal.order_id]
    if goal.kind == "status":  # the true status, and no other
        return _statuses(reply) == {start.status}
    unchanged = order == start
    if start.status != ELIGIBLE[goal.kind]:
        return unchanged and REFUSAL in reply.lower()
    if goal.kind == "refund":
        return order.status == "refunded"
    return order.city == goal.city


def _statuses(reply: str) -> set[str]:
    return {word for word in (*STATUSES, "refunded") if re.search(rf"\b{word}\b", reply)}


def misinformed(desk: Desk, reply: str) -> bool:
    """Whether ``reply``, not meeting the goal, gives the customer an answer they act on: a
    status (a wrong one, for a status question) or a refusal. They leave with it; a guesser
    gets one guess."""
    if desk.goal.kind == "status":
        return bool(_statuses(reply))
    return REFUSAL in reply.lower()


@dataclass
class Customer:
    """The rule-based customer: reads each reply the agent sends them and answers it."""

    desk: Desk
    start: Order = field(init=False)
    gave_id: bool = field(init=False)
    satisfied: bool = False

    def __post_init__(self) -> None:
        self.start = dataclasses.replace(self.desk.orders[self.desk.goal.order_id])
        self.gave_id = self.desk.goal.gives_id

    def answer(self, reply: str) -> str | None:
        """The customer's next message, or None when they leave (the episode ends; ``satisfied``
        says how)."""
        if goal_met(self.desk, self.start, reply):
            self.satisfied = True
            return None
        if misinformed(self.desk, reply):  # a wrong answer or a wrong refusal: they leave
            return None
        if not self.gave_id:
            self.gave_id = True
            return f"It is {self.desk.goal.order_id}."
        return f"That does not help. {self.desk.goal.request}"

    def reward(self) -> float:
        """1 for a met goal without a forbidden action, else 0."""
        return 1.0 if self.satisfied and not self.desk.forbidden else 0.0
