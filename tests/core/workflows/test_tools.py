"""Tagged tool calls, the safe calculator and the ToolBox that answers calls."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.sandbox import SandboxLimits
from core.workflows.tools import STOP_STRINGS, ToolBox, ToolCall, calculator, find_tool_call

pytestmark = pytest.mark.unit


def test_find_first_complete_call() -> None:
    text = "Let me compute. <calc>3*(4+5)</calc> then <python>print(1)</python>"
    call = find_tool_call(text)
    assert call == ToolCall("calc", "3*(4+5)", text.index("<calc>"), text.index("</calc>") + 7)
    assert text[call.start : call.end] == "<calc>3*(4+5)</calc>"
    assert find_tool_call(text[call.end :]) == ToolCall("python", "print(1)", 6, 31)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no tools here", None),
        ("<calc>1+2", None),  # incomplete: still being generated
        ("1+2</calc>", None),  # a closing tag without an opening one
        ("<result>3</result> <think>x</think>", None),  # not tools
        ("<Calc>1</Calc>", None),  # tags are case-sensitive
        ("</calc> <calc>1+1</calc>", ("calc", "1+1")),
        ("<calc>1+<calc>2*3</calc>", ("calc", "2*3")),  # nearest opening tag
        ("<python>x = 1\n</python>", ("python", "x = 1\n")),
        ("<calc>unclosed <python>print(2)</python>", ("python", "print(2)")),
        # generation stops at the first closing tag, so that call runs first
        ("<python>print('<calc>1</calc>')</python>", ("calc", "1")),
    ],
)
def test_find_tool_call_cases(text: str, expected: tuple[str, str] | None) -> None:
    call = find_tool_call(text)
    assert (None if call is None else (call.name, call.body)) == expected


def test_find_tool_call_with_custom_names() -> None:
    assert find_tool_call("<search>cats</search>", names=("search",)) == ToolCall(
        "search", "cats", 0, 21
    )
    assert find_tool_call("<calc>1</calc>", names=()) is None
    assert STOP_STRINGS == ("</calc>", "</python>")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("3*(4+5)", "27"),
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("-2**2", "-4"),
        ("2**3**2", "512"),
        ("6/3", "2"),
        ("7/2", "3.5"),
        ("1/3", "0.333333"),
        ("2/3", "0.666667"),
        ("7//2", "3"),
        ("-7 % 3", "2"),
        ("0.1+0.2", "0.3"),
        (" 12345.678 ", "12345.678"),
        ("1e-9", "1e-09"),
        ("1e20/1", "1e+20"),
        ("-(-4)", "4"),
        ("2**10", "1024"),
        ("2**-1", "0.5"),
    ],
)
def test_calculator_values(expr: str, expected: str) -> None:
    assert calculator(expr) == expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("", "empty expression"),
        ("2*(3", "invalid syntax"),
        ("2**100000", "exponent too large"),
        ("9**9**9", "exponent too large"),
        ("10.0**400", "result too large"),
        ("(-8)**(1/3)", "complex result"),
        ("1" * 2000, "longer than"),
        ("__import__('os')", "unsupported expression"),
        ("__import__('os').system('echo hi')", "unsupported expression"),
        ("(1).__class__", "unsupported expression"),
        ("x + 1", "unsupported expression"),
        ("'a' * 3", "unsupported expression"),
        ("True + 1", "unsupported expression"),
        ("[1, 2]", "unsupported expression"),
        ("2 ^ 3", "unsupported expression"),
        ("lambda: 1", "unsupported expression"),
    ],
)
def test_calculator_errors(expr: str, message: str) -> None:
    result = calculator(expr)
    assert result.startswith("error: ") and message in result, result


def test_toolbox_calc_and_python() -> None:
    box = ToolBox(SandboxLimits(wall_time_s=2.0))

    async def calls() -> list[str]:
        return [
            await box.call(ToolCall("calc", "3*(4+5)", 0, 0)),
            await box.call(ToolCall("python", "\n    print(2**10)\n", 0, 0)),
            await box.call(ToolCall("python", "```python\nprint('fenced')\n```", 0, 0)),
            await box.call(ToolCall("python", "print('partial')\n1/0", 0, 0)),
            await box.call(ToolCall("calc", "1/0", 0, 0)),
        ]

    assert asyncio.run(calls()) == [
        "<result>27</result>",
        "<result>1024</result>",
        "<result>fenced</result>",
        "<result>partial\nerror: exit status 1: ZeroDivisionError: division by zero</result>",
        "<result>error: division by zero</result>",
    ]
    assert (box.n_calls, box.n_errors) == (5, 2)
    assert box.total_latency_s > 0


def test_toolbox_unknown_tool() -> None:
    box = ToolBox(SandboxLimits())
    assert (
        asyncio.run(box.call(ToolCall("x", "anything", 0, 0)))
        == "<result>error: unknown tool 'x'</result>"
    )
    assert (box.n_calls, box.n_errors) == (1, 1)


def test_toolbox_simulated_latency() -> None:
    box = ToolBox(SandboxLimits(), latency_s=0.2)
    start = time.monotonic()
    assert asyncio.run(box.call(ToolCall("calc", "1+1", 0, 0))) == "<result>2</result>"
    assert time.monotonic() - start >= 0.2
    assert box.total_latency_s >= 0.2
    with pytest.raises(ValueError, match="latency_s"):
        ToolBox(SandboxLimits(), latency_s=-1.0)


def test_toolbox_latency_overlaps_across_concurrent_calls() -> None:
    box = ToolBox(SandboxLimits(), latency_s=0.2)

    async def many() -> list[str]:
        return await asyncio.gather(*(box.call(ToolCall("calc", f"{i}+1", 0, 0)) for i in range(5)))

    start = time.monotonic()
    assert asyncio.run(many()) == [f"<result>{i + 1}</result>" for i in range(5)]
    assert time.monotonic() - start < 0.9  # five sleeps overlap instead of adding up
    assert box.total_latency_s >= 1.0
