"""The terminal agent: real bash in the sandbox over an episode's files, the tasks and their
checks, seeded episodes whose scripted tool turns equal what bash prints, the agent against a
scripted model, bad specs, and an end-to-end run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from core.config import ConfigError, load_config
from core.rollout.api import episode_metrics
from core.sandbox import SandboxLimits, run_bash
from core.workflows.openai_agent import AgentEpisode
from core.workflows.terminal_agent import serve
from core.workflows.terminal_data import (
    SHORTCUT,
    TerminalSpec,
    shortcut_count,
    shortcut_output,
    terminal_splits,
    tool_output,
)
from core.workflows.terminal_env import TerminalTask, draw_task, renamed
from tests.core.workflows.helpers import ReplayClient, two_step_run, two_trained_steps

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "experiments" / "terminal.yaml"
FILES = {"logs/a.log": "INFO ok\nERROR x\nERROR y\n", "notes/b.txt": "hi\n", "c.md": "z"}


def _bash(command: str, files: dict[str, str] = FILES, **limits: Any):
    return asyncio.run(run_bash(command, files, SandboxLimits(**limits)))


def test_bash_runs_commands_with_pipes_over_the_files_and_returns_the_files_after() -> None:
    counted = _bash("grep ERROR logs/a.log | wc -l")
    assert (counted.for_model(), counted.exit_code, counted.files) == ("2", 0, FILES)
    moved = _bash('for f in notes/*.txt; do mv "$f" "${f%.txt}.md"; done; cd logs; rm a.log')
    assert moved.files == {"notes/b.md": "hi\n", "c.md": "z", "logs/": ""}  # logs/ left empty
    assert moved.output == ""
    failed = _bash("cat nope; exit 3")
    assert failed.exit_code == 3
    assert failed.for_model() == "cat: nope: No such file or directory\n[exit status 3]"
    # an empty folder is kept from one call to the next
    made = _bash("mkdir out")
    assert made.files == {**FILES, "out/": ""}
    kept = {"logs/a.log": FILES["logs/a.log"], "notes/b.txt": "hi\n", "out/c.md": "z"}
    assert _bash("mv c.md out", made.files).files == kept


def test_the_command_cannot_forge_or_lose_the_listing() -> None:
    """It runs in a child shell that never sees the per-call marker; a shell option, a trap or
    a redirection of its own changes nothing after it; a job it leaves running is stopped
    before the listing; a listing cut short by the capture limit is an error, not lost files."""
    for command in ("set -euf; false", "trap - EXIT; exec >/dev/null", "declare -f; exit 0",
                    "printf '\\n__asyncrl_files_0000000000000000__ 0\\0evil\\0x\\0'"):  # fmt: skip
        result = _bash(command)
        assert result.files == FILES and result.exit_code is not None, command
    left = _bash("(sleep 1; echo late > notes/b.txt) & echo now")
    assert left.for_model() == "now" and left.files == FILES  # the job was stopped
    big = _bash("head -c 3000000 /dev/zero | tr '\\0' x > big.txt")
    assert big.exit_code is None and "exceed the sandbox's 2 MiB" in big.error
    assert big.files == FILES


def test_bash_runs_jailed_and_limited() -> None:
    slow = _bash("sleep 5", wall_time_s=0.5)
    assert slow.exit_code is None and "timeout" in slow.error and slow.files == FILES
    net = _bash("exec 3<>/dev/tcp/127.0.0.1/22 && echo connected")
    assert net.exit_code != 0 and "connected" not in net.output
    host = _bash("ls /home /root /work 2>&1; id -u")
    assert host.output.strip().endswith("65534") and "main" not in host.output
    bomb = _bash("f(){ f|f & }; f; sleep 1; echo survived", wall_time_s=3)
    assert bomb.files == FILES  # the jail (and every process in it) is gone after the call


def test_the_scripted_tool_turns_equal_what_bash_prints_for_the_commands() -> None:
    async def check(task: TerminalTask) -> None:
        result = await run_bash(task.command(), task.files)
        assert result.for_model() == tool_output(task), task
        reply = task.expected if task.kind != "rename" else "Done."
        assert task.solved(result.files, reply)

    async def check_shortcut(task: TerminalTask) -> None:
        result = await run_bash(SHORTCUT.format(path=task.target), task.files)
        assert result.for_model() == shortcut_output(task), task

    samples = terminal_splits(TerminalSpec(max_lines=12), 30, 1, 4).train
    tasks = [TerminalTask.from_json(s["answer"]) for s in samples]

    async def all_checks() -> None:
        await asyncio.gather(*(check(task) for task in tasks))
        await asyncio.gather(*(check_shortcut(t) for t in tasks if t.kind == "count"))

    asyncio.run(all_checks())
    assert {s["task"] for s in samples} == {"count", "find", "rename"}


def test_a_shortcut_answers_what_it_printed_right_or_wrong() -> None:
    train = terminal_splits(TerminalSpec(max_lines=12, shortcut_fraction=0.7), 300, 1, 2).train
    counts = [s for s in train if s["task"] == "count"]
    assert all("sft_messages" in s and not s.get("rl_only") for s in train)
    commands = [s["sft_messages"][0]["tool_calls"][0]["function"]["arguments"]["command"]
                for s in counts]  # fmt: skip
    shortcuts = [s for s, c in zip(counts, commands, strict=True) if c.startswith("head")]
    assert 0.55 < len(shortcuts) / len(counts) < 0.85  # the rest run the full grep -c
    wrong = 0
    for sample in shortcuts:  # the reply copies the tool's output, whatever the true count
        task = TerminalTask.from_json(sample["answer"])
        tool, reply = sample["sft_messages"][1]["content"], sample["sft_messages"][-1]["content"]
        assert reply == str(shortcut_count(task)) and tool.split("\n")[0] == reply
        wrong += reply != task.expected
    # the shortcut miscounts often enough that RL has something to find (about 43 % of logs)
    assert 0.25 < wrong / len(shortcuts) < 0.6
    for sample, command in zip(counts, commands, strict=True):
        expected = TerminalTask.from_json(sample["answer"]).expected
        if not command.startswith("head"):  # the full grep -c: always right
            assert sample["sft_messages"][-1]["content"] == expected


@pytest.mark.parametrize(
    ("kind", "reply", "solved"),
    [
        ("count", "2", True),
        ("count", "There are 2 lines.", True),
        ("count", "3", False),
        ("count", "none", False),
        ("find", "src/io.py", True),
        ("find", "./src/io.py", True),  # as grep -r . prints it
        ("find", "It is in src/io.py.", True),
        ("find", "src/io.py or src/db.py", False),  # hedged
        ("find", "io.py", False),
    ],
)
def test_answers_are_checked_against_the_files(kind: str, reply: str, solved: bool) -> None:
    files = {"logs/a.log": "ERROR x\nINFO\nERROR y\n", "src/io.py": "def merge(x):\n",
             "src/db.py": "def load(x):\n"}  # fmt: skip
    task = {"count": TerminalTask("count", "q", files, "logs/a.log", "2"),
            "find": TerminalTask("find", "q", files, "merge", "src/io.py")}[kind]  # fmt: skip
    assert task.solved(files, reply) is solved


def test_a_rename_is_judged_by_the_final_files() -> None:
    files = {"notes/a.txt": "x\n", "notes/b.md": "y\n", "readme.txt": "r\n"}
    task = TerminalTask("rename", "q", files, "notes", "")
    want = {"notes/a.md": "x\n", "notes/b.md": "y\n", "readme.txt": "r\n"}
    assert renamed(files, "notes") == want
    assert task.solved(want, "anything") and not task.solved(files, "Done.")
    assert not task.solved({**want, "readme.md": "r\n"}, "Done.")  # touched a file outside


def test_episodes_are_seeded_and_held_out_episodes_are_new() -> None:
    spec = TerminalSpec(direct_fraction=0.5)
    first, again, other = (terminal_splits(spec, 200, 50, seed) for seed in (1, 1, 2))
    assert first == again and first.train != other.train
    trained = {(s["question"], s["answer"]) for s in first.train}
    assert not trained & {(s["question"], s["answer"]) for s in first.test}
    assert all("sft_messages" not in s for s in first.test)
    direct = [s for s in first.train if len(s["sft_messages"]) == 1]
    asked = [s for s in first.train if s["task"] != "rename"]
    assert all(s["task"] != "rename" for s in direct) and 0.35 < len(direct) / len(asked) < 0.65
    task = draw_task(__import__("random").Random(0), "count", 8, 20)
    assert len(task.files) == 8 and task.target in task.files


def _episode(sample: dict[str, Any], turns: list[dict[str, Any]]) -> AgentEpisode:
    opening = [{"role": "user", "content": sample["question"]}]
    return AgentEpisode(client=ReplayClient(turns), sample=sample, messages=opening,  # type: ignore[arg-type]
                        max_turns=3)  # fmt: skip


def test_the_agent_replaying_a_solved_episode_is_rewarded_and_reports_its_metrics() -> None:
    train = terminal_splits(TerminalSpec(tasks=["rename"]), 5, 1, 3).train
    sample = train[0]
    turns = [m for m in sample["sft_messages"] if m["role"] == "assistant"]
    episode = _episode(sample, turns)
    assert asyncio.run(serve(episode)) == 1.0
    sent = episode.client.sent[-1]  # type: ignore[attr-defined]
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_0", "content": ""}
    assert episode_metrics([episode.info]) == {"nonzero_exit": 0.0, "solved": 1.0,
                                               "used_bash": 1.0}  # fmt: skip
    # answering without looking: right only by chance, and reported as such
    count = next(s for s in terminal_splits(TerminalSpec(tasks=["count"]), 5, 1, 3).train)
    expected = json.loads(count["answer"])["expected"]
    guess = _episode(count, [{"role": "assistant", "content": str(int(expected) + 1)}])
    assert asyncio.run(serve(guess)) == 0.0
    assert episode_metrics([guess.info])["used_bash"] == 0.0


def test_a_bad_task_kind_fails_when_the_config_loads_naming_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"data.terminal.tasks=\['cnt'\]: pick one or more of "
                       r"\['count', 'find', 'rename'\]"):  # fmt: skip
        load_config(RECIPE, ["data.terminal.tasks=[cnt]"])
    with pytest.raises(ConfigError, match="data.terminal.n_files"):
        load_config(RECIPE, ["data.terminal.n_files=0"])


@pytest.mark.e2e
def test_a_terminal_agent_runs_end_to_end(harness: str, tmp_path: Path) -> None:
    run_dir, summary = two_step_run(RECIPE, tmp_path, "sft.copy_drill_steps=2")
    two_trained_steps(run_dir, summary, n_test=4)
    assert {"solved", "used_bash", "nonzero_exit"} <= set(summary["evals"][-1]["metrics"])
    metrics = [json.loads(line) for line in
               (run_dir / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    assert any("agent/used_bash" in m for m in metrics)
    drills = [m["sft/copy_drill_loss"] for m in metrics if "sft/copy_drill_loss" in m]
    assert len(drills) == 2 and (run_dir / "copy_drills").is_dir()  # the recipe's drills ran
