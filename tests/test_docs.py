"""The docs name only what exists: every `asyncrl` command and option, config key, repository
path and import path that README.md and docs/ write in code still resolves."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import shlex
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from core.config import Config
from core.config.loading import current_name
from flows.cli import app

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SECTIONS = tuple(f.name for f in dataclasses.fields(Config))
TOP_DIRS = ("core", "tasks", "flows", "experiments", "infra", "tests", "docs")

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"``?([^`\n]+?)``?")
KEY = re.compile(rf"(?<![\w./-])((?:{'|'.join(SECTIONS)})(?:\.\w+)+)(\*)?(?![\w/(-])")
PATH = re.compile(rf"(?<![\w./:-])((?:{'|'.join(TOP_DIRS)})/[\w./-]*)")
IMPORT = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP_DIRS[:4])})(?:\.\w+)+)(?::(\w+))?")
FILE_SUFFIXES = (".py", ".yaml", ".md", ".json", ".jsonl", ".png", ".sh", ".txt", ".lock")


def code_snippets(text: str) -> Iterator[str]:
    """Fenced blocks (line by line) and inline code spans."""
    for block in FENCE.findall(text):
        yield from block.splitlines()
    yield from SPAN.findall(FENCE.sub("", text))


def snippets() -> list[tuple[str, str]]:
    return [
        (page.relative_to(ROOT).as_posix(), s)
        for page in PAGES
        for s in code_snippets(page.read_text(encoding="utf-8"))
    ]


def key_exists(key: str, wildcard: bool) -> bool:
    """``section.field[.sub...]`` resolves in the schema (a trailing ``*`` matches a prefix);
    renamed keys (RENAMED) count, as the docs name them to say so."""
    if current_name(key) != key:
        return True
    cls: typing.Any = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return cls in (dict, typing.Any) or typing.get_origin(cls) is dict
        hints = typing.get_type_hints(cls)
        last = i == len(parts) - 1
        if wildcard and last:
            return any(name.startswith(part) for name in hints)
        if part not in hints:
            return False
        cls = hints[part]
        if typing.get_origin(cls) in (typing.Union, types.UnionType):
            cls = next(a for a in typing.get_args(cls) if a is not type(None))
    return True


def test_config_keys_the_docs_name_exist() -> None:
    missing = []
    for page, snippet in snippets():
        for key, star in KEY.findall(snippet):
            key = key.rstrip(".")
            if key.endswith(FILE_SUFFIXES) or key.count(".") == 0:
                continue
            if not key_exists(key, bool(star)):
                missing.append(f"{page}: {key}{star}")
    assert not missing, "config keys that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_repository_paths_the_docs_name_exist() -> None:
    missing = []
    for page, snippet in snippets():
        for path in PATH.findall(snippet):
            path = path.rstrip(".,")
            if any(c in path for c in "<>{}*") or path.startswith("tests/test-artifacts"):
                continue
            if not (ROOT / path).exists():
                missing.append(f"{page}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(sorted(set(missing)))


def resolves(dotted: str, attr: str) -> bool:
    """The longest importable module prefix of ``dotted``, then attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:
            continue
        obj: typing.Any = importlib.import_module(name)
        for rest in [*parts[cut:], *([attr] if attr else [])]:
            if not hasattr(obj, rest):
                return False
            obj = getattr(obj, rest)
        return True
    return False


def test_import_paths_the_docs_name_exist() -> None:
    missing = []
    for page, snippet in snippets():
        for dotted, attr in IMPORT.findall(snippet):
            dotted = dotted.rstrip(".")
            if dotted.endswith(FILE_SUFFIXES):
                continue
            if not resolves(dotted, attr):
                missing.append(f"{page}: {dotted}{':' + attr if attr else ''}")
    assert not missing, "import paths that do not resolve:\n" + "\n".join(sorted(set(missing)))


def benchmark_source(script: Path) -> str:
    """A script's text and its shared helpers' (options they add count as the script's)."""
    common = script.parent / "_common.py"
    return script.read_text(encoding="utf-8") + (
        common.read_text(encoding="utf-8") if common.is_file() else ""
    )


def command_errors(words: list[str], root: typing.Any) -> list[str]:
    """Subcommands (``a|b`` alternatives each) and long options of one ``asyncrl ...`` line."""
    errors: list[str] = []
    command, path = root, ["asyncrl"]
    rest = iter(words)
    for word in rest:
        if not hasattr(command, "commands") or word.startswith(("-", "[")):
            rest = iter([word, *rest])
            break
        names = word.split("|")
        unknown = [n for n in names if n not in command.commands]
        if unknown:
            return [f"{' '.join(path)} has no command {', '.join(unknown)}"]
        command, path = command.commands[names[0]], [*path, names[0]]
    script_text = ""
    if path[-1] == "bench":
        name = next(rest, "")
        script = ROOT / "experiments" / "benchmarks" / f"{name}.py"
        if not script.is_file():
            return [f"asyncrl bench has no benchmark {name!r}"]
        script_text = benchmark_source(script)
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    for word in rest:
        if word.startswith("#"):
            break
        option = word.lstrip("[").split("=")[0].rstrip("]")
        if not option.startswith("--"):
            continue
        known = f'"{option}"' in script_text if script_text else option in options
        if not known:
            errors.append(f"{' '.join(path)} has no option {option}")
    return errors


def test_commands_and_options_the_docs_name_exist() -> None:
    root = typer.main.get_command(app)
    errors = []
    for page, snippet in snippets():
        for match in re.finditer(r"(?<![\w/.-])asyncrl\s+([a-z][^`#\n]*)", snippet):
            try:
                words = shlex.split(match.group(1).replace("\\", " "))
            except ValueError:
                words = match.group(1).split()
            errors += [f"{page}: {e}" for e in command_errors(words, root)]
    assert not errors, "\n".join(sorted(set(errors)))


def test_scripts_the_docs_run_take_the_options_they_name() -> None:
    errors = []
    for page, snippet in snippets():
        for m in re.finditer(r"python (experiments/[\w/]+\.py)([^`#\n]*)", snippet):
            script = ROOT / m.group(1)
            if not script.is_file():
                errors.append(f"{page}: no script {m.group(1)}")
                continue
            text = benchmark_source(script)
            for option in re.findall(r"(?<!\w)--[\w-]+", m.group(2)):
                if f'"{option}"' not in text:
                    errors.append(f"{page}: {m.group(1)} has no option {option}")
    assert not errors, "\n".join(sorted(set(errors)))


LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#([\w-]+))?\)")


def heading_anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (Python-Markdown's ``toc`` slugify)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    anchors = set()
    for title in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower()
        anchors.add(re.sub(r"[-\s]+", "-", slug))
    return anchors


def link_errors(page: Path) -> list[str]:
    """Relative links from ``page`` to a missing page or heading (MkDocs checks the pages under
    docs/ itself when CI builds the site with --strict; README.md is outside it)."""
    errors = []
    for target, anchor in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        path = (page.parent / target).resolve()
        if not path.is_file():
            errors.append(f"{page.name}: no page {target}")
        elif anchor and anchor not in heading_anchors(path):
            errors.append(f"{page.name}: {target} has no heading #{anchor}")
    return errors


def test_readme_links_reach_a_page_and_heading() -> None:
    assert not link_errors(ROOT / "README.md"), "\n".join(link_errors(ROOT / "README.md"))


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """Each check above fails on a made-up name (so a pass means something)."""
    assert key_exists("rollout.max_staleness", False)
    assert not key_exists("rollout.max_stalenes", False)
    assert key_exists("algorithm.behaviour_", True) and not key_exists("rollout.zzz", True)
    assert key_exists("actor.lr", False)  # renamed: the docs may say so
    assert resolves("core.rewards.gsm8k", "gsm8k_reward")
    assert not resolves("core.rewards.gsm8k", "no_such_reward")
    root = typer.main.get_command(app)
    assert command_errors(["stack", "up|down|status"], root) == []
    assert command_errors(["stack", "sideways"], root)
    assert command_errors(["ablate", "x.yaml", "--algos", "grpo"], root) == []
    assert command_errors(["ablate", "x.yaml", "--algo", "grpo"], root)
    assert command_errors(["bench", "agent_latency", "--etas", "0,4"], root) == []
    assert command_errors(["bench", "agent_latency", "--etaz", "0,4"], root)
    (tmp_path / "a.md").write_text("# The loop, in `short`\n[x](a.md#the-loop-in-short) [y](b.md)")
    (tmp_path / "c.md").write_text("[z](a.md#the-loop)")
    assert link_errors(tmp_path / "a.md") == ["a.md: no page b.md"]
    assert link_errors(tmp_path / "c.md") == ["c.md: a.md has no heading #the-loop"]
