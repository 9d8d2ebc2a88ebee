"""From a YAML file and ``key=value`` overrides to a validated :class:`Config`.

A config is resolved in layers, each a dict checked against the schema before it is merged::

    schema defaults  <-  algorithm preset  <-  YAML file  <-  command-line overrides  <-  variant

The file and overrides are read and parsed once (:func:`parse_config`, a :class:`ConfigSource`);
variants — an ablation's algorithm and seed, a sweep trial's values — are layers of values on
top, so resolving N of them parses nothing again. Unknown keys, renamed keys and wrong types
raise :class:`ConfigError` naming the key before any work starts.

One value may come from the environment: ``ASYNCRL_FILEROOT`` (what ``asyncrl stack up`` prints)
replaces a ``cluster.fileroot`` left at its default (see :func:`_fileroot_from_env`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import math
import os
import re
import shutil
import time
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.algorithms.config import PRESETS
from core.config.sections import ClusterConfig, Config, ConfigError, ModelConfig
from core.data.sources import resolve_source
from core.data.templates import template_problems
from core.rewards.registry import resolve_reward
from core.rollout.api import workflow_class
from core.schema import bound_problems
from core.storage import filesystem, is_local, storage_retry

logger = logging.getLogger(__name__)

# Keys renamed since earlier releases, old -> new: a config (file, command line, variant) that
# uses an old key is read as if it named the new one, with a warning saying so.
RENAMED: dict[str, str] = {
    "actor": "learner",
    "eval.batch_size": "eval.max_concurrent",
    # the rollout section split by concern: the async loop stays, its engine, sampling, agent
    # and tool settings moved to sections of their own
    **{f"rollout.{key}": f"inference.{key}" for key in (
        "engine", "server_addresses", "n_servers", "server_launcher", "weight_sync",
        "server_python", "max_batch_rows", "prefix_cache_tokens", "kv_after_update",
    )},
    **{f"rollout.{key}": f"sampling.{key}" for key in (
        "max_new_tokens", "temperature", "top_p", "top_k",
    )},
    "rollout.agent": "agent.function",
    "rollout.max_turns": "agent.max_turns",
    "rollout.trajectory_mode": "agent.trajectory_mode",
    "rollout.tool_latency_s": "tools.latency_s",
    "rollout.tool_latency_p99_s": "tools.latency_p99_s",
    "rollout.tool_timeout_s": "tools.timeout_s",
    "rollout.sandbox": "tools.sandbox",
}  # fmt: skip


def current_name(key: str) -> str:
    """A dotted key under its name today (:data:`RENAMED`: ``actor.lr`` -> ``learner.lr``)."""
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old) :]
    return key


Layer = tuple[str, dict[str, Any]]  # (where it came from, a nested dict checked against the schema)

FILEROOT_ENV = "ASYNCRL_FILEROOT"  # a fileroot from the environment (the local stack's bucket)


@dataclass
class ConfigSource:
    """A YAML file and command-line overrides, read and parsed once.

    :meth:`resolve` merges them onto the schema defaults and the chosen algorithm preset; a
    *variant* (an ablation's algorithm and seed, a sweep trial's values) is one more layer on
    top, given as values, so N variants of one config never re-read or re-parse anything.
    """

    layers: list[Layer]
    file_layers: int = 0  # the first layers came from the YAML file; the rest were given explicitly

    def with_values(self, values: dict[str, Any], label: str = "values") -> ConfigSource:
        """The same source with one more layer of dotted-key values on top."""
        layer = _renamed(_nest(values), label)
        _check_keys(layer, Config, prefix="", source=label)
        return dataclasses.replace(self, layers=[*self.layers, (label, layer)])

    def resolve(self, variant: dict[str, Any] | None = None, label: str = "variant") -> Config:
        """The validated :class:`Config`; ``variant`` maps dotted keys to values
        (``{"algorithm": "ppo", "experiment.seed": 2}``) and wins over every layer."""
        source = self.with_values(variant, label) if variant else self
        return _merge(source.layers, explicit=source.layers[source.file_layers :])


def parse_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> ConfigSource:
    """Read the YAML file and parse ``key=value`` overrides, checking every key (not yet merged)."""
    layers: list[Layer] = []
    if path is not None:
        layers.append((str(path), _read_yaml(Path(path))))
    file_layers = len(layers)
    if overrides:
        layers.append(("command line", parse_overrides(overrides)))
    layers = [(source, _renamed(layer, source)) for source, layer in layers]
    for source, layer in layers:
        _check_keys(layer, Config, prefix="", source=source)
    return ConfigSource(layers, file_layers)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Resolve a YAML file and ``key=value`` overrides into a validated :class:`Config`."""
    return parse_config(path, overrides).resolve()


def _merge(layers: list[Layer], explicit: list[Layer]) -> Config:
    """schema defaults ← algorithm preset ← layers, then validation.

    ``explicit`` are the layers given on purpose (command line, variants), not read from a file.
    """
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
    _fill_derived(config)
    _fileroot_from_env(config, explicit)
    validate(config)
    return config


def _fileroot_from_env(config: Config, explicit: list[Layer]) -> None:
    """``ASYNCRL_FILEROOT``, when set, replaces a ``cluster.fileroot`` left at its default.

    Left at its default means: no command-line override or variant sets it, and the YAML file
    leaves it out or restates the default (the shipped configs say ``fileroot: runs``), so
    exporting what ``asyncrl stack up`` prints sends the runs to the stack's bucket. Any other
    value, and any value given on the command line, wins over the environment.
    """
    root = os.environ.get(FILEROOT_ENV, "").strip()
    if not root or config.cluster.fileroot != ClusterConfig().fileroot:
        return
    for _, layer in explicit:
        cluster = layer.get("cluster")
        if isinstance(cluster, dict) and "fileroot" in cluster:
            return
    config.cluster.fileroot = root


def fileroot_origin(config: Config) -> str:
    """Where ``config.cluster.fileroot`` came from, for the run's log line."""
    root = os.environ.get(FILEROOT_ENV, "").strip()
    if root and config.cluster.fileroot == root:
        return f"from {FILEROOT_ENV}; cluster.fileroot was left at its default"
    if root:
        return f"cluster.fileroot, set in the config; {FILEROOT_ENV} is not used"
    return "cluster.fileroot"


def _fill_derived(config: Config) -> None:
    """Defaults that depend on another section, written into the config so the run records them."""
    algo = config.algorithm
    if algo.loss_aggregation == "seq-mean-token-sum-norm" and algo.loss_norm_constant is None:
        algo.loss_norm_constant = float(config.sampling.max_new_tokens)  # Dr.GRPO's constant C


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
    """Value and cross-field checks, and the plug-ins resolved: all before any work starts."""
    for key, value in _leaves(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value} must be a finite number")
    for problem in bound_problems(config):  # the bounds and choices declared on the fields
        raise ConfigError(problem)
    try:
        source = resolve_source(config.data.source)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for problem in template_problems(config.data.template):
        raise ConfigError(problem)
    if config.data.source == "dataset" and not config.data.path:
        raise ConfigError("data.source=dataset needs data.path (a hub id, folder, file or URL)")
    _check_data_paths(config)
    _check_lora(config)
    if config.data.test_ratio >= 1:
        raise ConfigError(f"data.test_ratio={config.data.test_ratio} must be < 1")
    _check_humaneval(config)
    for problem in source.check(config.data) if source.check else []:
        raise ConfigError(problem)
    if config.eval.n_samples > 0 and not config.eval.temperature > 0:
        raise ConfigError(f"eval.temperature must be > 0 to sample, got {config.eval.temperature}")
    if config.sampling.temperature < 0:
        raise ConfigError(f"sampling.temperature must be >= 0, got {config.sampling.temperature}")
    if not 0 < config.sampling.top_p <= 1:
        raise ConfigError(f"sampling.top_p must be in (0, 1], got {config.sampling.top_p}")
    if source.generated and config.data.n_test <= 0:
        raise ConfigError("data.n_test must be > 0 for synthetic data")
    _check_tool_latency(config)
    _check_reward_model(config)
    algo = config.algorithm
    if algo.overlong_reward_penalty:
        max_len = algo.overlong_max_len or config.sampling.max_new_tokens
        if not 0 < algo.overlong_buffer_len <= max_len:
            raise ConfigError(
                f"algorithm.overlong_buffer_len={algo.overlong_buffer_len} must be in (0, {max_len}] "
                "(algorithm.overlong_max_len, or sampling.max_new_tokens when unset)"
            )
    for key, resolve in (
        ("rollout.reward_fn", resolve_reward),
        ("rollout.workflow", workflow_class),
    ):
        try:  # a typo fails now, not after minutes of SFT
            resolve(select(config, key))
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
    agent_workflow = config.rollout.workflow.endswith(":OpenAIAgentWorkflow")
    if config.agent.function or agent_workflow:
        from core.workflows.openai_agent import load_agent  # transformers: only when used

        try:
            load_agent(config.agent.function)
        except ValueError as err:
            raise ConfigError(f"agent.function: {err}") from None
    if config.agent.trajectory_mode == "per_turn" and not agent_workflow:
        raise ConfigError(
            "agent.trajectory_mode=per_turn needs the agent workflow "
            f"(rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow), got "
            f"rollout.workflow={config.rollout.workflow!r}"
        )
    r = config.inference
    fleet_launched = r.engine == "sglang" and not r.server_addresses
    if r.kv_after_update == "keep" and not (
        r.engine == "hf" or (fleet_launched and r.server_launcher == "asyncrl")
    ):
        raise ConfigError(
            "inference.kv_after_update=keep needs our engine (inference.engine=hf, or sglang with "
            "inference.server_launcher=asyncrl and no server_addresses)"
        )
    if r.max_batch_rows and not (r.engine == "hf" or fleet_launched):
        raise ConfigError(
            "inference.max_batch_rows needs an engine the run starts: inference.engine=hf, or "
            "sglang without server_addresses (servers launched with priority scheduling); got "
            f"inference.engine={r.engine!r}"
            + (" with server_addresses" if r.server_addresses else "")
        )
    if config.inference.engine == "vllm" and not config.inference.server_addresses:
        # The run launches SGLang-protocol servers (ours or SGLang), not vLLM.
        raise ConfigError(
            "inference.engine='vllm' needs running servers in inference.server_addresses "
            "(host:port, ...); or inference.engine=sglang with no addresses, which launches "
            "inference.n_servers servers (inference.server_launcher), or inference.engine=hf"
        )
    if config.inference.weight_sync == "distributed" and config.inference.engine != "sglang":
        raise ConfigError(
            "inference.weight_sync='distributed' needs inference.engine=sglang (servers that speak "
            f"SGLang's weight-update protocol), got inference.engine={config.inference.engine!r}"
        )
    python = config.inference.server_python
    if python and shutil.which(python) is None:
        raise ConfigError(f"inference.server_python={python!r}: no such interpreter")


def _check_reward_model(config: Config) -> None:
    """``reward_model.use_in_rl``: a model to use, and a workflow that scores with it."""
    rm = config.reward_model
    if not rm.use_in_rl:
        return
    if not rm.path and not rm.enabled:
        raise ConfigError(
            "reward_model.use_in_rl needs a reward model: reward_model.enabled=true (this run "
            "trains one) or reward_model.path (a folder a reward-model stage wrote)"
        )
    if not config.rollout.workflow.endswith(":RLVRWorkflow"):
        raise ConfigError(
            "reward_model.use_in_rl scores single-turn episodes (rollout.workflow="
            f"core.workflows.rlvr:RLVRWorkflow), got rollout.workflow={config.rollout.workflow!r}"
        )
    local = Path(rm.path.removeprefix("file://")).expanduser()
    if rm.path and is_local(rm.path) and not (local / "config.json").exists():
        raise ConfigError(
            f"reward_model.path={rm.path!r}: no reward model folder (config.json) there"
        )


def _check_tool_latency(config: Config) -> None:
    """A latency tail needs a median to scale and a p99 at or above it."""
    median, p99 = config.tools.latency_s, config.tools.latency_p99_s
    if p99 and not 0 < median <= p99:
        raise ConfigError(
            f"tools.latency_p99_s={p99} needs 0 < tools.latency_s <= it (the "
            f"median), got tools.latency_s={median}; or latency_p99_s=0 (no tail)"
        )


_STAMP = "%Y%m%d-%H%M%S"
_STAMPED = re.compile(r"^\d{8}-\d{6}$")


def _check_lora(config: Config) -> None:
    """``model.lora_*``: the dropout range, and the target modules against the architecture of a
    preset or local model folder (a hub id is checked once fetched, before the warm start)."""
    model = config.model
    if model.lora_rank == 0:
        return
    if not 0 <= model.lora_dropout < 1:
        raise ConfigError(f"model.lora_dropout must be in [0, 1), got {model.lora_dropout}")
    problem = lora_target_problem(model.path, model)
    if problem is not None:
        raise ConfigError(problem)


def lora_target_problem(path: str, model: ModelConfig) -> str | None:
    """Why ``model.lora_target_modules`` (``model``: the config's model section) do not fit the
    model at ``path`` (a preset or a local HF folder; None when it is neither)."""
    # transformers is imported only when LoRA is on: loading a config stays light.
    from core.models.lora_targets import model_skeleton, target_module_problem

    skeleton = model_skeleton(path, vocab_size=model.vocab_size)
    if skeleton is None:
        return None
    return target_module_problem(skeleton, list(model.lora_target_modules))


def _check_humaneval(config: Config) -> None:
    """source=humaneval: some problems held out, and some to train on when the run trains."""
    if config.data.source != "humaneval":
        return
    ratio = config.data.humaneval.train_ratio
    if ratio >= 1:
        raise ConfigError(f"data.humaneval.train_ratio={ratio} must be < 1 (some held out)")
    trains = config.sft.enabled or config.learner.total_steps > 0
    if ratio == 0 and trains:
        raise ConfigError(
            "data.humaneval.train_ratio=0 holds every problem out, so there is nothing to train "
            "on: set data.humaneval.train_ratio (e.g. 0.5), or evaluate only with "
            "sft.enabled=false learner.total_steps=0"
        )


def _check_data_paths(config: Config) -> None:
    """A local data path that does not exist fails now, not when the data stage starts (remote
    URLs and hub ids are checked by the loader; ``org/name`` is taken for a hub id)."""
    data = config.data
    paths = {"data.gsm8k_path": data.gsm8k_path} if data.source == "gsm8k" else {}
    if data.source == "humaneval":
        paths = {"data.humaneval.path": data.humaneval.path}
    if data.source == "dataset":
        paths = {"data.path": data.path, "data.test_path": data.test_path}
    if config.dpo.enabled or config.reward_model.enabled:
        pairs = config.preference
        paths |= {"preference.pairs": pairs.pairs, "preference.test_pairs": pairs.test_pairs}
    for key, value in paths.items():
        explicit = value.startswith(("/", ".", "~", "file://"))
        local = Path(value.removeprefix("file://")).expanduser()
        if value not in ("", "bundled", "hub", "synthetic") and explicit and not local.exists():
            raise ConfigError(f"{key}={value!r}: no such file or folder")


def stamp_trial(config: Config) -> Config:
    """Name the run folder of a run without ``experiment.trial``.

    A fresh run gets a timestamp. With ``checkpoint.recover=auto`` the run resumes the
    experiment's latest run instead: the only run folder under ``{fileroot}/{name}``, or the
    newest timestamped one when all are timestamped. Named trials beside others are ambiguous
    and raise :class:`ConfigError` listing them; with no run folder at all the run starts fresh.
    """
    if config.experiment.trial:
        return config
    if config.checkpoint.recover == "auto":
        latest = latest_trial(config)
        if latest is not None:
            logger.info(
                "recover=auto without experiment.trial: resuming the latest run, %s", latest
            )
            config.experiment.trial = latest
            return config
    config.experiment.trial = time.strftime(_STAMP)
    return config


@storage_retry
def run_trials(fileroot: str, experiment: str) -> list[str]:
    """The run folders (those with a ``config.yaml``) under ``{fileroot}/{experiment}``, sorted."""
    fs, path = filesystem(f"{fileroot.rstrip('/')}/{experiment}")
    if not fs.isdir(path):
        return []
    return sorted(
        entry.rstrip("/").rsplit("/", 1)[-1]
        for entry in fs.ls(path, detail=False)
        if fs.exists(f"{entry.rstrip('/')}/config.yaml")  # a run folder, not a cache
    )


def latest_trial(config: Config) -> str | None:
    """The trial ``recover=auto`` resumes when none is given (see :func:`stamp_trial`)."""
    root = f"{config.cluster.fileroot.rstrip('/')}/{config.experiment.name}"
    trials = run_trials(config.cluster.fileroot, config.experiment.name)
    if len(trials) <= 1:
        return trials[0] if trials else None
    named = [t for t in trials if not _STAMPED.match(t)]
    if named:
        raise ConfigError(
            f"checkpoint.recover=auto without experiment.trial is ambiguous: {root} holds "
            f"{len(trials)} runs, named ones among them ({', '.join(named)}); "
            f"set experiment.trial to one of: {', '.join(trials)}"
        )
    return trials[-1]


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``("sampling.temperature", 1.0)`` for every leaf field of a config (or section)."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def select(config: Config, dotted: str) -> Any:
    """``select(cfg, "rollout.max_staleness")``."""
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


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


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["a.b=1", "algorithm=dapo"]`` → ``{"a": {"b": 1}, "algorithm": {"name": "dapo"}}``:
    values typed as YAML reads them (``null``, ``1e-4``), keys not yet checked."""
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
    _keep_yaml11_words(fields, parsed)
    if presets:
        section = parsed.setdefault("algorithm", {})
        if not isinstance(section, dict):
            raise ConfigError(f"'algorithm' (in command line) is a section, got {section!r}")
        section["name"] = presets[-1]
    return parsed


def _keep_yaml11_words(fields: list[str], parsed: dict[str, Any]) -> None:
    """YAML 1.1 reads ``off``/``on``/``yes``/``no``/``y``/``n`` as booleans: keep such a value as
    the text the user wrote (``experiment.trial=off`` names a trial ``off``, not ``False``); a
    boolean field still takes the text (OmegaConf reads ``yes``/``off`` for a bool)."""
    for item in fields:
        key, raw = item.split("=", 1)
        *parents, leaf = key.split(".")
        node: Any = parsed
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if (
            isinstance(node, dict)
            and isinstance(node.get(leaf), bool)
            and raw.strip().lower() not in ("true", "false")
        ):
            node[leaf] = raw


def _renamed(layer: dict[str, Any], source: str) -> dict[str, Any]:
    """The layer with every key of :data:`RENAMED` moved to its new name (a warning per key);
    the layer itself is not changed. Both names in one layer is an error."""
    out = copy.deepcopy(layer)
    for old, new in RENAMED.items():
        *old_parents, old_leaf = old.split(".")
        parent = _section(out, old_parents)
        if parent is None or old_leaf not in parent:
            continue
        *new_parents, new_leaf = new.split(".")
        target = _section(out, new_parents, create=True)
        if target is None:
            raise ConfigError(f"'{'.'.join(new_parents)}' (in {source}) is a section")
        if new_leaf in target:
            raise ConfigError(f"config key '{old}' (in {source}) is now '{new}'; give only '{new}'")
        target[new_leaf] = parent.pop(old_leaf)
        logger.warning("config key '%s' (in %s) is now '%s': read as that", old, source, new)
    return out


def _section(layer: dict[str, Any], path: list[str], create: bool = False) -> dict[str, Any] | None:
    """The nested mapping at ``path`` (None where a part is missing or not a mapping)."""
    node: Any = layer
    for name in path:
        if create and name not in node:
            node[name] = {}
        node = node.get(name)
        if not isinstance(node, dict):
            return None
    return node


def _check_keys(layer: dict[str, Any], schema: type, prefix: str, source: str) -> None:
    """Every key must be a field of the schema; suggest the closest valid names otherwise."""
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key, value in layer.items():
        dotted = f"{prefix}{key}"
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
        expected = type_name(_hint_for(key))
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


def type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is None:
        return getattr(hint, "__name__", str(hint))
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin in (list, ListConfig):
        return f"list[{type_name(args[0])}]"
    if len(args) == 1:
        return f"{type_name(args[0])} or null"
    return str(hint)
