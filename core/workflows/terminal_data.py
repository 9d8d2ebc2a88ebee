"""Terminal episodes (``data.source=terminal``): seeded tasks of :mod:`core.workflows.terminal_env`,
each training one with a scripted agent's solved conversation for SFT.

A sample::

    {"id": "term-train-0", "question": "How many lines of logs/db.log contain ERROR?",
     "answer": the task as JSON (its files and what solves it: what the agent plays against),
     "task": its kind (count | find | rename: evaluation reports accuracy/<task>),
     "tools": the bash tool's schema ([] with show_tools=false),
     "sft_messages": the scripted agent's conversation, training samples only}

The scripted agent runs the task's command (:meth:`TerminalTask.command`: ``grep -c``,
``grep -rl``, a ``mv`` loop) with the ``bash`` tool, reads its output and answers. The tool
turn holds what bash prints for that command on the task's files, computed here without
running it (tests/core/workflows/test_terminal.py runs the commands in the sandbox and
compares). With ``direct_fraction`` the scripted agent instead answers ``count`` and ``find``
questions at once, without looking: SFT on that mix learns to guess often, which RL can
discover does not pay — the same lever as the math quickstart's direct answers. With
``shortcut_fraction`` it counts only a log's first lines (:data:`SHORTCUT`) on that share of
``count`` questions and answers what that printed, right or wrong: a warm start that reads the
tool's output but often runs the weaker command, which RL can discover does not pay. (An
earlier version kept a shortcut conversation only where its count was right; measured on the
tiny preset, docs: environments, the kept ones had small counts and the warm start learned
that prior instead of reading the output.)
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from core.data.sources import DataSection, Splits, data_source
from core.data.splits import fresh_episodes
from core.schema import documented
from core.workflows.terminal_env import KINDS, LOGS, MODULES, NOTES, TerminalTask, draw_task

# The scripted agent's shortcut for ``count``: right only when no ERROR line comes after the
# first five.
SHORTCUT_LINES = 5
SHORTCUT = f"head -n {SHORTCUT_LINES} {{path}} | grep -c ERROR"

# The one tool, kept bare (no description): every episode's system turn carries it.
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },  # fmt: skip
]


@dataclass
class TerminalSpec:
    """The generated terminal tasks and how the SFT conversations solve them."""

    tasks: list[str] = documented(
        help=f"The task kinds to draw from, uniformly: any of {list(KINDS)}.",
        factory=lambda: list(KINDS),
    )
    n_files: int = documented(
        3,
        "Files per episode: logs to pick from (count), modules to search (find), notes to rename "
        f"(rename). At most {min(len(LOGS), len(MODULES), len(NOTES))}.",
        ge=1, le=min(len(LOGS), len(MODULES), len(NOTES)),
    )  # fmt: skip
    max_lines: int = documented(
        6, "Most lines in a log (count's answer is at most this).", ge=1, le=1000
    )
    show_tools: bool = documented(
        True,
        "List the bash tool's schema in the system turn (the chat template's <tools> block), as "
        "a pretrained model needs; a from-scratch preset learns the call from SFT.",
    )
    direct_fraction: float = documented(
        0.0,
        "Share of the SFT conversations for count and find questions in which the scripted "
        "agent answers at once, without running a command: a warm start that guesses, which RL "
        "can improve on.",
        ge=0.0, le=1.0,
    )  # fmt: skip
    shortcut_fraction: float = documented(
        0.0,
        "Share of the SFT conversations for count questions in which the scripted agent counts "
        f"only the log's first {SHORTCUT_LINES} lines ({SHORTCUT!r}) and answers what that "
        "printed, wrong on longer logs: a warm start that reads the output of a weaker "
        "command, which RL can improve on.",
        ge=0.0, le=1.0,
    )  # fmt: skip


def spec_problems(spec: TerminalSpec) -> list[str]:
    """What is wrong with ``spec`` ([] = nothing), each naming its field."""
    unknown = [kind for kind in spec.tasks if kind not in KINDS]
    if unknown or not spec.tasks:
        return [f"data.terminal.tasks={spec.tasks}: pick one or more of {list(KINDS)}"]
    return []


def tool_output(task: TerminalTask) -> str:
    """What the bash tool returns for ``task.command()`` on the task's files (``grep -c`` exits
    1 when it counts none)."""
    if task.kind == "count":
        return _grep_count_output(int(task.expected))
    return {"find": task.expected, "rename": ""}[task.kind]


def _grep_count_output(count: int) -> str:
    """What ``grep -c`` prints for ``count`` matches (it exits 1 when it counts none)."""
    return str(count) if count else "0\n[exit status 1]"


def shortcut_count(task: TerminalTask) -> int:
    """The ERROR lines :data:`SHORTCUT` counts on a ``count`` task's log."""
    lines = task.files[task.target].splitlines()[:SHORTCUT_LINES]
    return sum("ERROR" in line for line in lines)


def shortcut_output(task: TerminalTask) -> str:
    """What bash prints for :data:`SHORTCUT` (the pipeline's exit status is grep's)."""
    return _grep_count_output(shortcut_count(task))


def solved_conversation(
    task: TerminalTask, direct: bool = False, shortcut: bool = False
) -> list[dict[str, Any]]:
    """The scripted agent's turns after the opening: run the command, then answer (``direct``:
    answer at once, ``count`` and ``find`` only; ``shortcut``: a ``count`` by
    :data:`SHORTCUT`, answering what it printed)."""
    reply = task.expected if task.kind != "rename" else "Done."
    if direct and task.kind != "rename":
        return [{"role": "assistant", "content": reply}]
    command, output = task.command(), tool_output(task)
    if shortcut and task.kind == "count":
        command, output = SHORTCUT.format(path=task.target), shortcut_output(task)
        reply = str(shortcut_count(task))
    call = {"id": "call_0", "type": "function",
            "function": {"name": "bash", "arguments": {"command": command}}}  # fmt: skip
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": output},
        {"role": "assistant", "content": reply},
    ]


def _episodes(spec: TerminalSpec, seed: int, split: str) -> Iterator[dict[str, Any]]:
    rng = random.Random(f"terminal-{seed}-{split}")
    index = 0
    while True:
        task = draw_task(rng, rng.choice(spec.tasks), spec.n_files, spec.max_lines)
        sample = {"id": f"term-{split}-{index}", "question": task.question,
                  "answer": task.to_json(), "task": task.kind,
                  "tools": copy.deepcopy(TOOLS) if spec.show_tools else []}  # fmt: skip
        if split == "train":
            direct = task.kind != "rename" and rng.random() < spec.direct_fraction
            shortcut = (task.kind == "count" and not direct and spec.shortcut_fraction > 0
                        and rng.random() < spec.shortcut_fraction)  # fmt: skip
            sample["sft_messages"] = solved_conversation(task, direct, shortcut)
        index += 1
        yield sample


def terminal_splits(spec: TerminalSpec, n_train: int, n_test: int, seed: int) -> Splits:
    """``n_train`` training episodes and ``n_test`` held-out ones, none repeating a
    training episode's question and files."""
    train, test = fresh_episodes(
        lambda split: _episodes(spec, seed, split),
        n_train,
        n_test,
        "widen data.terminal (tasks, n_files, max_lines)",
    )
    return Splits(train, test)


# version 2: a shortcut conversation answers what the shortcut printed (it was kept only where right)
@data_source("terminal", generated=True, version=2,
             check=lambda data: spec_problems(data.terminal))  # fmt: skip
def terminal(data: DataSection, seed: int) -> Splits:
    """Seeded terminal tasks: ``n_train`` to train on, ``n_test`` held out."""
    return terminal_splits(data.terminal, data.n_train, data.n_test, seed)
