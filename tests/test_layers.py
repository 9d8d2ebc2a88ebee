"""The floor plan, checked: imports point down the layers, never back up.

``flows → tasks → core``; inside ``core`` each package sits on a layer and imports only from
its own layer or the ones below (docs/design.md, "Layout"). Every import counts, a lazy one
inside a function or one under ``TYPE_CHECKING`` included: each is a dependency a reader has
to follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top. A package (core/<name>/) or top-level module (core/<name>.py) per entry.
CORE_LAYERS: list[set[str]] = [
    {"schema", "redaction", "plugins", "processes", "storage"},  # plain helpers
    {"algorithms", "models", "sandbox"},  # pure functions, model building, the jail
    {"inference", "rewards"},  # engines and their clients; verifiers
    {"data"},  # datasets and prompts (knows the engine's stop strings)
    {"rollout", "workflows"},  # the episode contract and executor; what an episode is
    {"training"},  # the learner: losses over trajectories
    {"config", "evaluation"},  # configs name all of the above
    {"runtime"},  # workers, the Trainer, the pipeline
]
LAYER = {name: i for i, names in enumerate(CORE_LAYERS) for name in names}
# Inside core/inference: the contract and the formats both sides share, then our engine and the
# clients of engines elsewhere (neither knows the other), then the server over our engine.
INFERENCE_LAYERS: list[set[str]] = [
    {"__init__", "api", "chat", "tool_calls", "stop_strings", "weight_broadcast"},
    {"engine", "clients"},
    {"server"},
]
INFERENCE_LAYER = {name: i for i, names in enumerate(INFERENCE_LAYERS) for name in names}
NEVER_IN_CORE = ("prefect", "mlflow", "optuna", "tasks", "flows", "experiments")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every absolute import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def unit(parts: tuple[str, ...]) -> str:
    """The layer unit of ``core/...`` path parts or ``core.x.y`` module parts."""
    return parts[1].removesuffix(".py") if len(parts) > 1 else ""


def core_violations(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / "core").rglob("*.py")):
        here = unit(path.relative_to(root).parts)
        for line, module in imports(path):
            where = f"{path.relative_to(root)}:{line} imports {module}"
            top = module.split(".")[0]
            if top in NEVER_IN_CORE:
                found.append(where)
            elif top == "core" and module != "core":
                there = unit(tuple(module.split(".")))
                if there != here and LAYER[there] > LAYER[here]:
                    found.append(f"{where} (layer {LAYER[there]} above {LAYER[here]})")
    return found


def test_every_core_package_has_a_layer() -> None:
    units = {p.name.removesuffix(".py") for p in (ROOT / "core").iterdir()}
    units = {u for u in units if not u.startswith(("_", "."))}
    assert units - set(LAYER) == set(), "put these in CORE_LAYERS"


def test_core_imports_point_down_the_layers() -> None:
    assert core_violations() == []


def inference_violations(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / "core" / "inference").rglob("*.py")):
        here = path.relative_to(root / "core" / "inference").parts[0].removesuffix(".py")
        for line, module in imports(path):
            parts = module.split(".")
            if parts[:2] != ["core", "inference"] or len(parts) < 3:
                continue
            there = parts[2]
            if there != here and INFERENCE_LAYER[there] >= max(INFERENCE_LAYER[here], 1):
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


def test_inference_engine_clients_and_server_point_down() -> None:
    """The server builds on the engine; the engine and the clients never import each other or
    the server; the shared modules import none of them."""
    placed = {p.name.removesuffix(".py") for p in (ROOT / "core" / "inference").iterdir()}
    assert placed - {"__pycache__"} - set(INFERENCE_LAYER) == set(), "put these in INFERENCE_LAYERS"
    assert inference_violations() == []


def test_tasks_never_import_flows() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "tasks").rglob("*.py"))
        for line, module in imports(path)
        if module.split(".")[0] in ("flows", "experiments")
    ]
    assert found == []


def test_the_check_sees_an_import_up_the_layers(tmp_path: Path) -> None:
    """The checker itself, on a made-up tree: data importing the runtime lazily, and Prefect."""
    (tmp_path / "core" / "data").mkdir(parents=True)
    (tmp_path / "core" / "data" / "x.py").write_text(
        "from core.models import load_model\n\ndef f():\n    import core.runtime.trainer\n"
        "    from prefect import flow\n"
    )
    assert core_violations(tmp_path) == [
        "core/data/x.py:4 imports core.runtime.trainer (layer 7 above 3)",
        "core/data/x.py:5 imports prefect",
    ]


@pytest.mark.parametrize("name", sorted(LAYER))
def test_each_layer_unit_exists(name: str) -> None:
    assert (ROOT / "core" / name).is_dir() or (ROOT / "core" / f"{name}.py").exists(), name


def test_the_inference_check_sees_the_engine_importing_a_client(tmp_path: Path) -> None:
    engine = tmp_path / "core" / "inference" / "engine"
    engine.mkdir(parents=True)
    (engine / "x.py").write_text(
        "from core.inference.api import SamplingParams\n"
        "from core.inference.clients.http_client import API_KEY_ENV\n"
    )
    assert inference_violations(tmp_path) == [
        "core/inference/engine/x.py:2 imports core.inference.clients.http_client"
    ]
