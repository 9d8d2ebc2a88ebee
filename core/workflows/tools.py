"""Agent tools and their tagged call format.

The model calls a tool by writing ``<calc>3*(4+5)</calc>`` or ``<python>print(2**10)</python>``;
the environment appends ``<result>27</result>`` to the conversation (the workflow tokenizes that
and masks it out of the loss). Generation is meant to stop at a closing tag (``STOP_STRINGS``),
so the call that completes first is the one that runs: ``find_tool_call`` takes the earliest
closing tag and pairs it with the nearest opening tag of the same tool before it.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import math
import operator
import re
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.sandbox import DEFAULT_LIMITS, SandboxLimits, run_python

log = logging.getLogger(__name__)

TOOL_NAMES = ("calc", "python")
STOP_STRINGS = tuple(f"</{name}>" for name in TOOL_NAMES)

_MAX_EXPR_CHARS = 1000
_MAX_INT_BITS = 4000  # ~1200 decimal digits: enough for arithmetic, too small to hurt
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_FENCE = re.compile(r"^\s*```[\w+-]*\s*\n(.*?)\n\s*```\s*$", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call: ``text[start:end]`` is ``<name>body</name>``."""

    name: str
    body: str
    start: int
    end: int


def find_tool_call(text: str, names: tuple[str, ...] = TOOL_NAMES) -> ToolCall | None:
    """The first complete call in ``text`` (earliest closing tag), or None."""
    if not names:
        return None
    closing = re.compile("</(" + "|".join(re.escape(n) for n in names) + ")>")
    for close in closing.finditer(text):
        name = close.group(1)
        open_at = text.rfind(f"<{name}>", 0, close.start())
        if open_at >= 0:
            body = text[open_at + len(name) + 2 : close.start()]
            return ToolCall(name, body, open_at, close.end())
    return None


class CalcError(ValueError):
    """An expression the calculator refuses or cannot evaluate."""


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, complex):
            raise CalcError("complex result")
        if isinstance(result, int) and result.bit_length() > _MAX_INT_BITS:
            raise CalcError("result too large")
        return result
    raise CalcError(f"unsupported expression {ast.unparse(node)[:40]!r}")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse powers whose result would be huge before computing them."""
    if abs(base) <= 1 or exponent <= 0:
        return
    if exponent * math.log2(abs(base)) > _MAX_INT_BITS:
        raise CalcError("exponent too large")


def _format(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        raise CalcError("result is not a finite number")
    if value == 0:
        return "0"
    if abs(value) >= 1e15 or abs(value) < 1e-6:
        return f"{value:.6g}"
    return f"{round(value, 6):.6f}".rstrip("0").rstrip(".")


def calculator(expr: str) -> str:
    """Evaluate plain arithmetic safely (no names, calls or attributes); errors start with 'error:'."""
    expr = expr.strip()
    if not expr:
        return "error: empty expression"
    if len(expr) > _MAX_EXPR_CHARS:
        return f"error: expression longer than {_MAX_EXPR_CHARS} characters"
    try:
        return _format(_eval(ast.parse(expr, mode="eval")))
    except SyntaxError:
        return "error: invalid syntax"
    except ZeroDivisionError:
        return "error: division by zero"
    except OverflowError:
        return "error: result too large"
    except (CalcError, ValueError, MemoryError, RecursionError) as exc:
        return f"error: {str(exc) or type(exc).__name__}"


def _python_source(body: str) -> str:
    """The code inside ``<python>``: dedented, with a surrounding Markdown fence removed."""
    fenced = _FENCE.match(body)
    return textwrap.dedent(fenced.group(1) if fenced else body).strip("\n")


class ToolBox:
    """Runs tool calls for agent episodes and formats their ``<result>`` turn.

    ``latency_s`` is a simulated delay added to every call, modelling real agent I/O (search
    APIs, remote sandboxes) so that the asynchronous rollout's overlap can be studied.
    """

    def __init__(self, limits: SandboxLimits = DEFAULT_LIMITS, latency_s: float = 0.0) -> None:
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.limits = limits
        self.latency_s = latency_s
        self.n_calls = 0
        self.n_errors = 0
        self.total_latency_s = 0.0

    async def call(self, call: ToolCall) -> str:
        """Run ``call`` and return ``<result>...</result>``; tool failures are results, not raises."""
        start = time.monotonic()
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        text, ok = await self._dispatch(call)
        self.n_calls += 1
        self.n_errors += not ok
        self.total_latency_s += time.monotonic() - start
        return f"<result>{text}</result>"

    async def _dispatch(self, call: ToolCall) -> tuple[str, bool]:
        if call.name == "calc":
            text = calculator(call.body)
            return text, not text.startswith("error:")
        if call.name == "python":
            result = await run_python(_python_source(call.body), self.limits)
            text = result.output.rstrip()
            if not result.ok:
                text = f"{text}\nerror: {result.error}" if text else f"error: {result.error}"
            return text, result.ok
        log.debug("unknown tool %r", call.name)
        return f"error: unknown tool '{call.name}'", False
