"""The experiment schema: one dataclass per section, every field documented, validated in one place.

A config is resolved in layers, each a dict checked against the schema before it is merged:

    schema defaults  <-  algorithm preset  <-  YAML file  <-  command-line ``key=value`` overrides

``algorithm=NAME`` (in the YAML or on the command line) selects a preset from
``core.algorithms.PRESETS``; the YAML's and the command line's ``algorithm.*`` fields then override
the preset field by field. Unknown keys and wrong types raise :class:`ConfigError` naming the key
(with the closest valid names) before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.algorithms.config import PRESETS, AlgorithmConfig
from core.data.synthetic import SyntheticSpec
from core.schema import documented


class ConfigError(ValueError):
    """A user-caused configuration problem; the message names the key, file or value."""


@dataclass
class ExperimentConfig:
    """Names and seeds: where a run's outputs go is ``{cluster.fileroot}/{name}/{trial}``."""

    name: str = documented(
        "quickstart", "Experiment name; groups runs in the output folder and in MLflow."
    )
    trial: str = documented(
        "", "Trial name inside the experiment; empty = a timestamp chosen at start."
    )
    seed: int = documented(
        1, "Seed for data generation, model initialisation, sampling and shuffling."
    )
    description: str = documented("", "Free text recorded with the run.")


@dataclass
class ClusterConfig:
    """Where the run's files live and how many machines it spans."""

    fileroot: str = documented(
        "runs",
        "Root for run outputs and checkpoints: a local folder or any fsspec URL (s3://bucket/prefix).",
    )
    n_nodes: int = documented(1, "Number of machines (Ray nodes) the run spans.")
    n_gpus_per_node: int = documented(0, "GPUs per node; 0 runs everything on CPU.")
    ray_address: str = documented(
        "", "Address of an existing Ray cluster to join; empty starts a local one."
    )


@dataclass
class SchedulerConfig:
    """How the rollout and learner processes are placed."""

    type: str = documented(
        "local", "'local' (plain processes, for debugging) or 'ray' (Ray actors)."
    )
    learner_cpus: float = documented(1.0, "CPUs reserved for the learner group (Ray).")
    rollout_cpus: float = documented(1.0, "CPUs reserved for the rollout side (Ray).")
    torch_threads: int = documented(
        1, "torch.set_num_threads per process: each side on its own core(s), or they fight."
    )


@dataclass
class ModelConfig:
    """The policy model and its tokenizer."""

    path: str = documented(
        "tiny",
        "A from-scratch preset ('tiny' ~1M, 'small' ~10M params), a local HF folder, or a hub id.",
    )
    tokenizer_path: str = documented(
        "",
        "Tokenizer folder or hub id; empty = the model's (presets train a BPE tokenizer on the training data).",
    )
    vocab_size: int = documented(
        400, "Vocabulary size of the tokenizer trained for a preset model."
    )
    dtype: str = documented("float32", "Parameter dtype: float32 (CPU), bfloat16 or float16 (GPU).")
    attn_implementation: str = documented(
        "sdpa", "Attention kernel: 'sdpa' (CPU/GPU), 'flash_attention_2' (GPU, gpu extra), 'eager'."
    )


@dataclass
class DataConfig:
    """Training and held-out problems."""

    source: str = documented(
        "synthetic", "'synthetic' (generated GSM8K-style problems) or 'gsm8k'."
    )
    gsm8k_path: str = documented(
        "bundled",
        "For source=gsm8k: 'bundled' (the repo's copy), 'hub' (openai/gsm8k), or a file/folder path or fsspec URL with {split}.jsonl|parquet.",
    )
    template: str = documented("plain", "Prompt template name (core.data.templates).")
    n_train: int = documented(
        4000, "Training problems (synthetic: generated; gsm8k: the first n, 0 = all)."
    )
    n_test: int = documented(
        1000,
        "Held-out problems (synthetic: generated; gsm8k: the first n of the test split, 0 = all).",
    )
    strict: bool = documented(False, "Raise on a bad row instead of skipping it with a warning.")
    synthetic: SyntheticSpec = documented(
        help="Synthetic problem generator knobs.", factory=SyntheticSpec
    )


@dataclass
class SFTConfig:
    """Supervised warm start on the training solutions before RL."""

    enabled: bool = documented(
        True, "Run the SFT warm start (preset models start from random weights)."
    )
    steps: int = documented(600, "Optimizer steps.")
    batch_size: int = documented(32, "Sequences per optimizer step.")
    lr: float = documented(2e-3, "Peak learning rate (AdamW).")
    warmup_steps: int = documented(30, "Linear warm-up steps before the cosine decay.")
    min_lr_ratio: float = documented(0.1, "Final learning rate as a fraction of the peak.")
    weight_decay: float = documented(0.0, "AdamW weight decay.")
    max_grad_norm: float = documented(1.0, "Gradient clipping norm.")


@dataclass
class RolloutConfig:
    """Generation: engines, sampling, and the staleness bound of the async loop."""

    engine: str = documented(
        "hf", "'hf' (in-process engine, CPU/GPU), 'sglang' or 'vllm' (HTTP servers)."
    )
    server_addresses: list[str] = documented(
        [], "host:port of running inference servers (sglang/vllm/ours); empty = launch our own."
    )
    batch_size: int = documented(16, "Prompts per training step (each sampled group_size times).")
    max_staleness: int = documented(
        4, "Staleness bound η: a sample may be at most η weight versions old; 0 = synchronous RL."
    )
    max_concurrent: int = documented(64, "Most episodes in flight at once.")
    max_new_tokens: int = documented(64, "Generation budget per completion.")
    temperature: float = documented(
        1.0, "Sampling temperature (the learner scales its logits the same way)."
    )
    top_p: float = documented(1.0, "Nucleus sampling; 1.0 = off.")
    top_k: int = documented(0, "Top-k sampling; 0 = off.")
    workflow: str = documented(
        "core.rollout.rlvr:RLVRWorkflow", "Episode workflow, by import path."
    )
    reward_fn: str = documented(
        "core.rewards.gsm8k:gsm8k_reward",
        "Reward function (completion, reference) -> float, by import path.",
    )
    max_failure_rate: float = documented(
        0.2, "Stop the run when more than this share of episodes fail."
    )
    max_turns: int = documented(4, "Tool-agent workflow: most model turns per episode.")
    tool_latency_s: float = documented(
        0.0, "Tool-agent workflow: simulated latency per tool call (models remote tools/APIs)."
    )
    tool_timeout_s: float = documented(
        5.0, "Tool-agent workflow: wall-time limit of one sandboxed python call."
    )


@dataclass
class LearnerConfig:
    """The learner that trains the policy."""

    n_ranks: int = documented(1, "Data-parallel FSDP2 ranks (processes).")
    micro_batch_tokens: int = documented(
        8192, "Token budget of one micro-batch (gradient accumulation splits above it)."
    )
    total_steps: int = documented(40, "RL training steps (weight versions).")


@dataclass
class CriticConfig:
    """Value model for PPO-style presets (algorithm.use_critic)."""

    path: str = documented(
        "",
        "Critic initial weights; empty = the policy's initial weights with a fresh value head (learning rate: algorithm.critic_lr).",
    )


@dataclass
class EvalConfig:
    """Held-out evaluation."""

    n_problems: int = documented(1000, "Held-out problems evaluated (<= data.n_test; 0 = all).")
    max_concurrent: int = documented(
        128, "Most held-out episodes in flight at once (the engine batches what is in flight)."
    )
    max_new_tokens: int = documented(64, "Generation budget per answer.")
    every_n_steps: int = documented(10, "Evaluate every N RL steps (0 = only before and after).")


@dataclass
class CheckpointConfig:
    """Checkpoints for exact resume."""

    url: str = documented(
        "", "Where checkpoints go (any fsspec URL); empty = {run_dir}/checkpoints."
    )
    every_n_steps: int = documented(20, "Checkpoint every N RL steps (0 = only at the end).")
    keep_last: int = documented(2, "Committed checkpoints to keep.")
    recover: str = documented(
        "off", "'off' or 'auto' (resume from the latest committed checkpoint)."
    )


@dataclass
class TrackingConfig:
    """Experiment tracking."""

    mlflow_uri: str = documented(
        "", "MLflow tracking URI; empty = sqlite under the experiment folder."
    )
    mlflow_experiment: str = documented("", "MLflow experiment name; empty = experiment.name.")


@dataclass
class Config:
    """A whole experiment."""

    experiment: ExperimentConfig = documented(help="Names and seeds.", factory=ExperimentConfig)
    cluster: ClusterConfig = documented(help="Files and machines.", factory=ClusterConfig)
    scheduler: SchedulerConfig = documented(help="Process placement.", factory=SchedulerConfig)
    model: ModelConfig = documented(help="Policy model and tokenizer.", factory=ModelConfig)
    data: DataConfig = documented(help="Training and held-out data.", factory=DataConfig)
    sft: SFTConfig = documented(help="Supervised warm start.", factory=SFTConfig)
    rollout: RolloutConfig = documented(help="Generation and staleness.", factory=RolloutConfig)
    algorithm: AlgorithmConfig = documented(
        help="RL algorithm (preset + overrides).", factory=AlgorithmConfig
    )
    learner: LearnerConfig = documented(help="Policy learner (FSDP2 ranks).", factory=LearnerConfig)
    critic: CriticConfig = documented(help="Value model.", factory=CriticConfig)
    eval: EvalConfig = documented(help="Held-out evaluation.", factory=EvalConfig)
    checkpoint: CheckpointConfig = documented(help="Checkpoints.", factory=CheckpointConfig)
    tracking: TrackingConfig = documented(help="Tracking.", factory=TrackingConfig)

    @property
    def run_dir(self) -> str:
        """``{fileroot}/{experiment}/{trial}``: every output of this run lives under it."""
        root = self.cluster.fileroot.rstrip("/")
        return f"{root}/{self.experiment.name}/{self.experiment.trial}"


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------

CHOICES: dict[str, tuple[str, ...]] = {
    "scheduler.type": ("local", "ray"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.attn_implementation": ("sdpa", "eager", "flash_attention_2"),
    "data.source": ("synthetic", "gsm8k"),
    "rollout.engine": ("hf", "sglang", "vllm"),
    "checkpoint.recover": ("off", "auto"),
}


# Keys renamed since earlier releases: an old key fails with a message naming the new one.
RENAMED: dict[str, str] = {"actor": "learner", "eval.batch_size": "eval.max_concurrent"}

Layer = tuple[str, dict[str, Any]]  # (where it came from, a nested dict checked against the schema)


@dataclass
class ConfigSource:
    """A YAML file and command-line overrides, read and parsed once.

    :meth:`resolve` merges them onto the schema defaults and the chosen algorithm preset; a
    *variant* (an ablation's algorithm and seed, a sweep trial's values) is one more layer on
    top, given as values, so N variants of one config never re-read or re-parse anything.
    """

    layers: list[Layer]

    def with_values(self, values: dict[str, Any], label: str = "values") -> ConfigSource:
        """The same source with one more layer of dotted-key values on top."""
        layer = _nest(values)
        _check_keys(layer, Config, prefix="", source=label)
        return ConfigSource([*self.layers, (label, layer)])

    def resolve(self, variant: dict[str, Any] | None = None, label: str = "variant") -> Config:
        """The validated :class:`Config`; ``variant`` maps dotted keys to values
        (``{"algorithm": "ppo", "experiment.seed": 2}``) and wins over every layer."""
        return _merge((self.with_values(variant, label) if variant else self).layers)


def parse_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> ConfigSource:
    """Read the YAML file and parse ``key=value`` overrides, checking every key (not yet merged)."""
    layers: list[Layer] = []
    if path is not None:
        layers.append((str(path), _read_yaml(Path(path))))
    if overrides:
        layers.append(("command line", _parse_overrides(overrides)))
    for source, layer in layers:
        _check_keys(layer, Config, prefix="", source=source)
    return ConfigSource(layers)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Resolve a YAML file and ``key=value`` overrides into a validated :class:`Config`."""
    return parse_config(path, overrides).resolve()


def _merge(layers: list[Layer]) -> Config:
    """schema defaults ← algorithm preset ← layers, then validation."""
    preset = "grpo"
    for _, layer in layers:
        algorithm = layer.get("algorithm")
        if isinstance(algorithm, str):  # `algorithm: dapo` selects a preset ...
            preset = algorithm
        elif isinstance(algorithm, dict) and "name" in algorithm:  # ... so does algorithm.name
            preset = algorithm["name"]
    if preset not in PRESETS:
        raise ConfigError(f"algorithm={preset!r} is not a preset; choose one of {sorted(PRESETS)}")
    merged = OmegaConf.structured(Config)
    preset_layer = (f"preset {preset!r}", {"algorithm": {**PRESETS[preset], "name": preset}})
    for source, layer in [preset_layer, *layers]:
        if isinstance(layer.get("algorithm"), str):  # the preset name, applied above
            layer = {**layer, "algorithm": {"name": layer["algorithm"]}}
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as err:
            raise ConfigError(_type_error_message(err, source)) from None
    try:
        config = typing.cast(Config, OmegaConf.to_object(merged))
    except (OmegaConfBaseException, ValueError) as err:  # __post_init__ validation
        raise ConfigError(str(err).split("\n")[0]) from None
    validate(config)
    return config


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "c": 2}`` → ``{"a": {"b": 1}, "c": 2}``."""
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"'{key}' conflicts with another key of the same variant")
        node[leaf] = value
    return nested


def validate(config: Config) -> None:
    """Cross-field checks that no single section can make on its own."""
    for key, choices in CHOICES.items():
        value = select(config, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {list(choices)}")
    positive = [
        "rollout.batch_size",
        "rollout.max_concurrent",
        "rollout.max_new_tokens",
        "learner.n_ranks",
        "learner.micro_batch_tokens",
        "eval.max_concurrent",
        "eval.max_new_tokens",
        "sft.batch_size",
        "model.vocab_size",
        "cluster.n_nodes",
    ]
    for key in positive:
        if select(config, key) <= 0:
            raise ConfigError(f"{key} must be > 0, got {select(config, key)}")
    non_negative = [
        "rollout.max_staleness",
        "learner.total_steps",
        "sft.steps",
        "rollout.top_k",
        "eval.every_n_steps",
        "checkpoint.every_n_steps",
        "eval.n_problems",
        "data.n_train",
        "data.n_test",
        "cluster.n_gpus_per_node",
    ]
    for key in non_negative:
        if select(config, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {select(config, key)}")
    if config.rollout.temperature < 0:
        raise ConfigError(f"rollout.temperature must be >= 0, got {config.rollout.temperature}")
    if not 0 < config.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {config.rollout.top_p}")
    if config.checkpoint.keep_last < 1:
        raise ConfigError(f"checkpoint.keep_last must be >= 1, got {config.checkpoint.keep_last}")
    if config.data.source == "synthetic" and config.data.n_test <= 0:
        raise ConfigError("data.n_test must be > 0 for synthetic data")
    algo = config.algorithm
    if algo.overlong_reward_penalty:
        max_len = algo.overlong_max_len or config.rollout.max_new_tokens
        if not 0 < algo.overlong_buffer_len <= max_len:
            raise ConfigError(
                f"algorithm.overlong_buffer_len={algo.overlong_buffer_len} must be in (0, {max_len}] "
                "(algorithm.overlong_max_len, or rollout.max_new_tokens when unset)"
            )
    for key in ("rollout.workflow", "rollout.reward_fn"):
        if ":" not in select(config, key):
            raise ConfigError(
                f"{key}={select(config, key)!r} must be an import path 'module:attribute'"
            )
    if (
        config.rollout.engine != "hf"
        and not config.rollout.server_addresses
        and config.cluster.n_gpus_per_node == 0
    ):
        raise ConfigError(
            f"rollout.engine={config.rollout.engine!r} needs GPUs (cluster.n_gpus_per_node > 0) "
            "or running servers in rollout.server_addresses"
        )


def stamp_trial(config: Config) -> Config:
    """Give a run without ``experiment.trial`` a timestamp trial (its run folder's name)."""
    if not config.experiment.trial:
        config.experiment.trial = time.strftime("%Y%m%d-%H%M%S")
    return config


def select(config: Config, dotted: str) -> Any:
    """``select(cfg, "rollout.max_staleness")``."""
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dict (for YAML/JSON)."""
    return typing.cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(config)))


def to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def flatten(config: Config) -> dict[str, Any]:
    """``{"rollout.max_staleness": 4, ...}`` (lists as JSON strings) — e.g. MLflow params."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else key, sub)
        else:
            flat[prefix] = json.dumps(value) if isinstance(value, list) else value

    walk("", to_dict(config))
    return flat


def config_hash(config: Config, sections: tuple[str, ...] | None = None) -> str:
    """A stable short hash of the whole config, or of some sections (e.g. ``("data",)`` for caching)."""
    data = to_dict(config)
    if sections is not None:
        data = {key: data[key] for key in sections}
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def field_docs(schema: type = Config, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every leaf field — the source of ``docs/config.md``."""
    rows = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows.extend(field_docs(typing.cast(type, hint), f"{key}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((key, _type_name(hint), repr(default), f.metadata.get("help", "")))
    return rows


def docs_markdown() -> str:
    """``docs/config.md``: every field as a Markdown table row (``asyncrl config docs``)."""
    lines = [
        "# Config reference",
        "",
        "Generated by `asyncrl config docs` from the dataclass schema in `core/config.py`. A config",
        "resolves as *schema defaults ← algorithm preset ← YAML ← command-line overrides*.",
        "",
        "| key | type | default | help |",
        "|---|---|---|---|",
    ]
    for key, type_name, default, help_text in field_docs():
        lines.append(f"| `{key}` | {type_name} | `{default}` | {help_text} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as err:  # yaml.YAMLError and friends: report the file either way
        raise ConfigError(f"cannot parse config file {path}: {err}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not a list")
    return typing.cast(dict[str, Any], OmegaConf.to_container(loaded))


def _parse_overrides(overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r} must look like key=value (e.g. rollout.max_staleness=4)"
            )
    # `algorithm=NAME` names a preset; kept apart so it cannot clobber `algorithm.*` overrides
    # given before it on the same command line.
    presets = [item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0] == "algorithm"]
    fields = [item for item in overrides if item.split("=", 1)[0] != "algorithm"]
    try:
        parsed = typing.cast(dict[str, Any], OmegaConf.to_container(OmegaConf.from_dotlist(fields)))
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot parse overrides {overrides}: {err}") from None
    if presets:
        section = parsed.setdefault("algorithm", {})
        if not isinstance(section, dict):
            raise ConfigError(f"'algorithm' (in command line) is a section, got {section!r}")
        section["name"] = presets[-1]
    return parsed


def _check_keys(layer: dict[str, Any], schema: type, prefix: str, source: str) -> None:
    """Every key must be a field of the schema; suggest the closest valid names otherwise."""
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key, value in layer.items():
        dotted = f"{prefix}{key}"
        if dotted in RENAMED:
            raise ConfigError(f"config key '{dotted}' (in {source}) is now '{RENAMED[dotted]}'")
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.5)
            valid = [f"{prefix}{name}" for name in (close or names)]
            label = "did you mean" if close else "valid keys here"
            raise ConfigError(
                f"unknown config key '{dotted}' (in {source}); {label}: {', '.join(valid)}"
            )
        hint = hints[key]
        if not prefix and key == "algorithm" and isinstance(value, str):
            continue  # `algorithm: dapo` names a preset (checked when merged)
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"'{dotted}' (in {source}) is a section; expected a mapping, got {value!r}"
                )
            _check_keys(value, typing.cast(type, hint), f"{dotted}.", source)


def _type_error_message(err: OmegaConfBaseException, source: str) -> str:
    key = getattr(err, "full_key", None) or "?"
    expected = "?"
    try:
        expected = _type_name(_hint_for(key))
    except (AttributeError, KeyError):
        pass
    value = getattr(err, "value", None)
    got = f" got {value!r}" if value is not None else ""
    first_line = str(err).split("\n")[0]
    return f"config key '{key}' (in {source}) expects {expected};{got} ({first_line})"


def _hint_for(dotted: str) -> Any:
    schema: Any = Config
    hint: Any = None
    for part in dotted.split("."):
        hint = typing.get_type_hints(schema)[part]
        schema = hint
    return hint


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is None:
        return getattr(hint, "__name__", str(hint))
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin in (list, ListConfig):
        return f"list[{_type_name(args[0])}]"
    if len(args) == 1:
        return f"{_type_name(args[0])} or null"
    return str(hint)
