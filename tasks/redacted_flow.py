"""Flows whose run parameters Prefect stores redacted.

Prefect records every flow run's parameters in its database (the UI shows them). A run's
``Config`` — or an ablation's parsed config with the user's overrides — may hold a secret (a
password in a tracking URI, a token in a data URL), so the flows here store them through
:func:`core.redaction.redact`, the same redaction MLflow's params and artifacts get. The flow
itself receives the real values.

One thing redaction cannot reach: parameters typed into a deployment's run form are stored by
Prefect's API as typed. Secrets there belong in the environment (``key=${oc.env:NAME}``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Flow

from core.redaction import redact

P = ParamSpec("P")
R = TypeVar("R")


class RedactedFlow(Flow[P, R]):
    """A Prefect flow that stores its run parameters redacted."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return redact(super().serialize_parameters(parameters))


def redacted_flow(**options: Any) -> Callable[[Callable[P, R]], RedactedFlow[P, R]]:
    """``@redacted_flow(name=...)``: Prefect's ``@flow`` with redacted stored parameters."""

    def wrap(fn: Callable[P, R]) -> RedactedFlow[P, R]:
        return RedactedFlow(fn=fn, **options)

    return wrap
