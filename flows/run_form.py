"""The typed fields of the deployments' run form, and how they become config values.

Prefect builds a deployment's run form from its entry point's signature: a field's type gives
the widget (a choice for ``algorithm``, a number for ``max_staleness``), the pydantic ``Field``
its bounds, and ``json_schema_extra`` the title and description shown beside it. Each typed
field sets one config key; empty (``None``) leaves the config file's value. The free
``overrides`` set any other key.

Order: the typed fields are one layer on top of the config file *and* the free overrides. A key
set both by a typed field and by a free override is an error rather than a silent winner.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from core.algorithms.config import preset_names
from core.config import ConfigError, ConfigSource, field_docs, parse_config

# Typed field name -> the config key it sets.
FORM_KEYS: dict[str, str] = {
    "algorithm": "algorithm.name",
    "max_staleness": "rollout.max_staleness",
    "total_steps": "learner.total_steps",
    "lr": "algorithm.lr",
    "seed": "experiment.seed",
    "fileroot": "cluster.fileroot",
}
# Free overrides that set the same key as a typed field (``algorithm=NAME`` names the preset).
_ALIASES: dict[str, tuple[str, ...]] = {"algorithm.name": ("algorithm",)}

_HELP = {key: help_text for key, _, _, help_text in field_docs()}
_AS_IN_FILE = "None (the default): as in the config file."


def _described(title: str, description: str, **bounds: Any) -> Any:
    """A pydantic ``Field`` whose title and description Prefect's run form shows.

    Prefect 3 sets each parameter's title to its name and its description from the docstring,
    so both go through ``json_schema_extra``, which is written into the schema last."""
    return Field(json_schema_extra={"title": title, "description": description}, **bounds)


def _config_field(name: str, title: str) -> Any:
    """A typed field described by the help text of the config key it sets."""
    key = FORM_KEYS[name]
    return _described(title, f"{_HELP[key]} {_AS_IN_FILE} (Sets {key}.)")


# The preset names as a choice, from the registry (``Literal`` takes a tuple of values at runtime).
AlgorithmName = Literal[tuple(preset_names())]  # type: ignore[valid-type]

ConfigPath = Annotated[
    str,
    _described(
        "Config file",
        "Experiment YAML on the worker, e.g. experiments/quickstart.yaml (a relative path "
        "resolves in the flow run's working directory).",
    ),
]
Algorithm = Annotated[
    AlgorithmName | None,
    _described(
        "Algorithm",
        f"Algorithm preset (docs/algorithms.md); the config file's algorithm.* keys still apply "
        f"on top of it. {_AS_IN_FILE} (Sets algorithm.name.)",
    ),
]
MaxStaleness = Annotated[int | None, Field(ge=0), _config_field("max_staleness", "Max staleness η")]
TotalSteps = Annotated[int | None, Field(ge=0), _config_field("total_steps", "RL steps")]
LearningRate = Annotated[float | None, Field(gt=0), _config_field("lr", "Learning rate")]
Seed = Annotated[int | None, _config_field("seed", "Seed")]
Fileroot = Annotated[
    str | None,
    _described(
        "Output root (fileroot)",
        "Root for run outputs and checkpoints as the worker sees it: a local folder or any "
        f"fsspec URL (s3://bucket/prefix). {_AS_IN_FILE} (Sets cluster.fileroot.)",
    ),
]
Overrides = Annotated[
    list[str] | None,
    _described(
        "Other overrides",
        "Any other config key as dotted key=value, e.g. rollout.batch_size=8; every key is "
        "listed in docs/config.md. A key set here and by a field above is an error.",
    ),
]
Algorithms = Annotated[
    list[AlgorithmName] | None,
    _described("Algorithms", "Algorithm presets to compare. None: grpo, ppo, dapo."),
]
Seeds = Annotated[
    int,
    _described(
        "Seeds per algorithm", "Runs per algorithm, seeded from the config's seed upward.", ge=1
    ),
]
Parallel = Annotated[
    str,
    _described(
        "Variants at once",
        "How many variants run at the same time, each in its own process: auto (as many as the "
        "worker's cores fit) or a whole number.",
        pattern=r"^(auto|[1-9][0-9]*)$",
    ),
]


def form_values(**fields: Any) -> dict[str, Any]:
    """The config values the typed fields set: ``{"rollout.max_staleness": 2, ...}``, leaving
    out the empty ones."""
    unknown = sorted(set(fields) - set(FORM_KEYS))
    assert not unknown, f"not run-form fields: {unknown}"
    return {FORM_KEYS[name]: value for name, value in fields.items() if value is not None}


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].strip()


def check_no_conflicts(values: dict[str, Any], overrides: list[str]) -> None:
    """Raise ConfigError naming the field when a free override sets a typed field's key."""
    fields = {key: name for name, key in FORM_KEYS.items()}
    for key, value in values.items():
        same_key = {key, *_ALIASES.get(key, ())}
        for override in overrides:
            if _override_key(override) in same_key:
                raise ConfigError(
                    f"{fields[key]}={value!r} and override {override!r} both set {key}; "
                    f"set it in one place"
                )


def form_source(config_path: str, overrides: list[str], values: dict[str, Any]) -> ConfigSource:
    """The config file and free overrides, parsed, with the typed fields' ``values`` on top."""
    check_no_conflicts(values, overrides)
    source = parse_config(config_path, overrides)
    return source.with_values(values, label="run form") if values else source
