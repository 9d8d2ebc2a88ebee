"""The experiment config: one dataclass per section, every field documented, validated in one place.

- :mod:`core.config.sections` — the schema (:class:`Config` and its sections);
- :mod:`core.config.loading` — YAML + ``key=value`` overrides parsed once into a
  :class:`ConfigSource`, resolved (with variants) into a validated :class:`Config`;
- :mod:`core.config.export` — dict/YAML, flat params, a stable hash, the generated docs.

``algorithm=NAME`` (in the YAML or on the command line) selects a preset from
``core.algorithms.PRESETS``; the YAML's and the command line's ``algorithm.*`` fields then override
the preset field by field.
"""

from core.config.export import (
    RUN_NEUTRAL,
    config_changes,
    config_hash,
    docs_markdown,
    field_docs,
    flatten,
    run_params,
    to_dict,
    to_yaml,
)
from core.config.loading import (
    RENAMED,
    ConfigSource,
    load_config,
    parse_config,
    parse_overrides,
    select,
    stamp_trial,
    validate,
)
from core.config.sections import (
    CheckpointConfig,
    ClusterConfig,
    Config,
    ConfigError,
    CriticConfig,
    DataConfig,
    EvalConfig,
    ExperimentConfig,
    LearnerConfig,
    ModelConfig,
    RolloutConfig,
    SchedulerConfig,
    SFTConfig,
    TrackingConfig,
    WatchdogConfig,
)

__all__ = [
    "RENAMED",
    "CheckpointConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "ConfigSource",
    "CriticConfig",
    "DataConfig",
    "EvalConfig",
    "ExperimentConfig",
    "LearnerConfig",
    "ModelConfig",
    "RolloutConfig",
    "SFTConfig",
    "SchedulerConfig",
    "TrackingConfig",
    "WatchdogConfig",
    "RUN_NEUTRAL",
    "config_changes",
    "config_hash",
    "docs_markdown",
    "field_docs",
    "flatten",
    "run_params",
    "load_config",
    "parse_config",
    "parse_overrides",
    "select",
    "stamp_trial",
    "to_dict",
    "to_yaml",
    "validate",
]
