"""Terminal tasks: a scratch folder of files, a question or a chore about them, and a check.

Each episode starts from its own files (``{relative path: text}``), which the agent's ``bash``
tool (:func:`core.sandbox.run_bash`: real bash in the sandbox) reads and changes. The kinds:

    ``count``   "How many lines of logs/db.log contain ERROR?"   solved by the right number
    ``find``    "Which file defines merge?"                      solved by the right path
    ``rename``  "Rename every .txt file in notes to .md."         solved by the final files:
                every ``notes/*.txt`` now ``.md`` with its text, nothing else changed

``count`` and ``find`` are judged on the agent's final reply (its last number, resp. the one
path it names among the episode's files, also as ``./path``); ``rename`` on the files after the episode, whatever
the reply says.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass

KINDS = ("count", "find", "rename")
LEVELS = ("INFO", "WARN", "ERROR")
LOGS = ("app", "db", "web", "api", "job", "mail", "auth", "cache")
MODULES = ("util", "core", "io", "net", "db", "ui", "cli", "math")
FUNCTIONS = ("parse", "load", "save", "send", "sort", "merge", "split", "check", "build",
             "clean", "fetch", "print", "scale", "count", "join", "pack")  # fmt: skip
NOTES = ("todo", "ideas", "plan", "draft", "list", "memo", "log", "week")
WORDS = ("start", "stop", "retry", "timeout", "done", "open", "closed", "slow", "ready", "full")
# The solutions the scripted agent runs (core.workflows.terminal_data); the model may use any.
COMMANDS = {
    "count": "grep -c ERROR {path}",
    "find": "grep -rl 'def {name}' src",
    "rename": 'for f in notes/*.txt; do mv "$f" "${{f%.txt}}.md"; done',
}


@dataclass
class TerminalTask:
    """One episode's files, its question and what solves it."""

    kind: str  # one of KINDS
    question: str
    files: dict[str, str]
    target: str  # count: the log's path; find: the function's name; rename: the folder
    expected: str  # count: the number; find: the path; rename: "" (the final files decide)

    @classmethod
    def from_json(cls, text: str) -> TerminalTask:
        return cls(**json.loads(text))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    def command(self) -> str:
        """The scripted agent's command for this task."""
        return COMMANDS[self.kind].format(path=self.target, name=self.target)

    def solved(self, files: dict[str, str], reply: str) -> bool:
        """Whether the episode, ending with ``files`` and the final ``reply``, did the task."""
        if self.kind == "rename":
            return files == renamed(self.files, self.target)
        if self.kind == "count":
            numbers = re.findall(r"-?\d+", reply)
            return bool(numbers) and numbers[-1] == self.expected
        return named_paths(reply, self.files) == {self.expected}


def named_paths(reply: str, files: dict[str, str]) -> set[str]:
    """The episode's file paths ``reply`` names, as written or as ``./path`` or
    ``/sandbox/path`` (how ``grep -r .`` and ``find`` print them)."""
    return {
        path
        for path in files
        if re.search(rf"(?<![\w/.])(?:\./|/sandbox/)?{re.escape(path)}\b", reply)
    }


def renamed(files: dict[str, str], folder: str) -> dict[str, str]:
    """``files`` with every ``{folder}/*.txt`` (not in a subfolder) renamed to ``.md``."""
    out = {}
    for path, text in files.items():
        parent, _, name = path.rpartition("/")
        if parent == folder and name.endswith(".txt"):
            path = f"{parent}/{name[: -len('.txt')]}.md"
        out[path] = text
    return out


def draw_task(rng: random.Random, kind: str, n_files: int, max_lines: int) -> TerminalTask:
    """A ``kind`` task over ``n_files`` files (``max_lines`` lines in each log)."""
    if kind == "count":
        names = rng.sample(LOGS, n_files)
        files = {f"logs/{name}.log": _log(rng, max_lines) for name in names}
        path = f"logs/{rng.choice(names)}.log"
        count = sum("ERROR" in line for line in files[path].splitlines())
        question = f"How many lines of {path} contain ERROR?"
        return TerminalTask(kind, question, files, path, str(count))
    if kind == "find":
        modules = rng.sample(MODULES, n_files)
        functions = rng.sample(FUNCTIONS, 2 * n_files)
        files = {
            f"src/{module}.py": "".join(
                f"def {name}(x):\n    return x\n\n" for name in functions[2 * i : 2 * i + 2]
            )
            for i, module in enumerate(modules)
        }
        i = rng.randrange(2 * n_files)
        question = f"Which file defines {functions[i]}?"
        return TerminalTask(kind, question, files, functions[i], f"src/{modules[i // 2]}.py")
    if kind == "rename":
        names = rng.sample(NOTES, n_files)
        n_txt = rng.randint(1, n_files)
        files = {
            f"notes/{name}.{'txt' if k < n_txt else 'md'}": f"{rng.choice(WORDS)}\n"
            for k, name in enumerate(names)
        }
        files["readme.txt"] = "notes live in notes/\n"  # outside notes: must stay .txt
        question = "Rename every .txt file in notes to .md."
        return TerminalTask(kind, question, files, "notes", "")
    raise ValueError(f"unknown terminal task kind {kind!r}: expected one of {list(KINDS)}")


def _log(rng: random.Random, max_lines: int) -> str:
    n = rng.randint(1, max_lines)
    return "".join(f"{rng.choice(LEVELS)} {rng.choice(WORDS)}\n" for _ in range(n))
