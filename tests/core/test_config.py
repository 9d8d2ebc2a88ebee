"""Config schema: layering, presets, overrides, and errors that name the key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from core.config import (
    Config,
    ConfigError,
    config_changes,
    config_hash,
    docs_markdown,
    field_docs,
    flatten,
    load_config,
    parse_config,
    run_params,
    stamp_trial,
    to_yaml,
)
from core.plugins import load_object

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
GSM8K = ROOT / "experiments" / "gsm8k_grpo.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_shipped_configs_validate() -> None:
    quick = load_config(QUICKSTART)
    assert quick.model.path == "tiny"
    assert quick.data.source == "synthetic"
    assert quick.algorithm.name == "grpo"
    gpu = load_config(GSM8K)
    assert gpu.model.path == "Qwen/Qwen2-1.5B-Instruct"
    assert gpu.inference.engine == "hf"  # our engine on CUDA: the single-node command as written
    assert gpu.cluster.n_gpus_per_node == 8
    assert gpu.model.dtype == "bfloat16"
    agent = load_config(ROOT / "experiments" / "agent_tools.yaml")
    assert (
        agent.rollout.workflow == "core.workflows.tagged_tools:ToolAgentWorkflow"
        and agent.data.synthetic.tool_calls
    )


def test_dotted_overrides_win_over_yaml() -> None:
    cfg = load_config(
        QUICKSTART,
        ["rollout.max_staleness=7", "cluster.n_nodes=2", "data.synthetic.max_operand=20"],
    )
    assert cfg.rollout.max_staleness == 7
    assert cfg.cluster.n_nodes == 2
    assert cfg.data.synthetic.max_operand == 20
    # untouched values keep the YAML's
    assert cfg.sampling.max_new_tokens == 48


def test_list_override() -> None:
    cfg = load_config(QUICKSTART, ['data.synthetic.operations=["+"]'])
    assert list(cfg.data.synthetic.operations) == ["+"]


def test_defaults_without_a_file() -> None:
    cfg = load_config(None, [])
    assert isinstance(cfg, Config)
    assert cfg.rollout.max_staleness == Config().rollout.max_staleness


def test_algorithm_preset_then_field_overrides(tmp_path: Path) -> None:
    dapo = load_config(QUICKSTART, ["algorithm=dapo"])
    grpo = load_config(QUICKSTART)
    assert dapo.algorithm.name == "dapo"
    assert (
        dapo.algorithm.eps_clip_high is not None
        and dapo.algorithm.eps_clip_high > dapo.algorithm.eps_clip
    )
    assert dapo.algorithm.dynamic_sampling and not grpo.algorithm.dynamic_sampling
    # a field override applies on top of the preset, whatever the order on the command line
    tuned = load_config(QUICKSTART, ["algorithm.eps_clip_high=0.4", "algorithm=dapo"])
    assert tuned.algorithm.eps_clip_high == 0.4
    assert tuned.algorithm.dynamic_sampling
    # the YAML may name the preset inside the section and override fields beside it
    path = write(tmp_path, "algorithm:\n  name: ppo\n  gamma: 0.9\n")
    ppo = load_config(path)
    assert ppo.algorithm.use_critic and ppo.algorithm.gamma == 0.9


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="algorithm='grpoo'.*grpo"):
        load_config(QUICKSTART, ["algorithm=grpoo"])


def test_unknown_key_names_key_and_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["rollout.max_stalenes=4"])
    assert "rollout.max_stalenes" in str(err.value)
    assert "rollout.max_staleness" in str(err.value)
    assert "command line" in str(err.value)

    path = write(tmp_path, "modle:\n  path: tiny\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "'modle'" in str(err.value) and "model" in str(err.value) and str(path) in str(err.value)


def test_wrong_type_names_key_and_expected_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["rollout.max_staleness=abc"])
    message = str(err.value)
    assert "rollout.max_staleness" in message and "int" in message and "abc" in message

    path = write(tmp_path, "eval:\n  max_concurrent: [1, 2]\n")
    with pytest.raises(ConfigError, match="eval.max_concurrent"):
        load_config(path)

    path = write(tmp_path, "rollout: 3\n")
    with pytest.raises(ConfigError, match="'rollout'.*section"):
        load_config(path)


def test_value_checks_name_the_field() -> None:
    with pytest.raises(ConfigError, match="rollout.max_staleness must be >= 0"):
        load_config(QUICKSTART, ["rollout.max_staleness=-1"])
    with pytest.raises(ConfigError, match="scheduler.type"):
        load_config(QUICKSTART, ["scheduler.type=kubernetes"])
    with pytest.raises(ConfigError, match="inference.engine='vllm' needs running servers"):
        load_config(QUICKSTART, ["inference.engine=vllm"])
    with pytest.raises(ConfigError, match="inference.n_servers must be > 0"):
        load_config(QUICKSTART, ["inference.engine=sglang", "inference.n_servers=0"])
    with pytest.raises(ConfigError, match="inference.server_python='/nope/python'"):
        load_config(QUICKSTART, ["inference.engine=sglang", "inference.server_python=/nope/python"])
    assert load_config(QUICKSTART, ["inference.engine=sglang"]).inference.n_servers == 1
    with pytest.raises(ConfigError, match="inference.kv_after_update=keep needs our engine"):
        load_config(QUICKSTART, ["inference.kv_after_update=keep", "inference.engine=sglang",
                                 "inference.server_launcher=sglang"])  # fmt: skip
    with pytest.raises(ConfigError, match="inference.kv_after_update='reuse' is not one of"):
        load_config(QUICKSTART, ["inference.kv_after_update=reuse"])
    for engine in ("hf", "sglang"):  # the in-process engine, or our launched servers
        keep = ["inference.kv_after_update=keep", f"inference.engine={engine}"]
        assert load_config(QUICKSTART, keep).inference.kv_after_update == "keep"
    sglang = ["inference.engine=sglang", "inference.server_addresses=[10.0.0.5:30000]"]
    assert load_config(GSM8K, sglang).inference.server_addresses == ["10.0.0.5:30000"]
    for engine in ("hf", "sglang"):  # the in-process engine, or servers the run launches
        rows = ["inference.max_batch_rows=8", f"inference.engine={engine}"]
        assert load_config(QUICKSTART, rows).inference.max_batch_rows == 8
    running = "inference.max_batch_rows needs an engine the run starts"
    with pytest.raises(ConfigError, match=f"{running}.*'sglang' with server_addresses"):
        load_config(QUICKSTART, ["inference.max_batch_rows=8", *sglang])
    with pytest.raises(ConfigError, match=f"{running}.*'vllm'"):
        load_config(GSM8K, ["inference.max_batch_rows=8", "inference.engine=vllm",
                            "inference.server_addresses=[10.0.0.5:8000]"])  # fmt: skip
    with pytest.raises(ConfigError, match="inference.max_batch_rows must be >= 0"):
        load_config(QUICKSTART, ["inference.max_batch_rows=-1"])


def test_overlong_buffer_must_fit_the_generation_budget() -> None:
    with pytest.raises(ConfigError, match="algorithm.overlong_buffer_len=4096 must be in"):
        load_config(QUICKSTART, ["algorithm=dapo", "algorithm.overlong_buffer_len=4096"])
    assert load_config(QUICKSTART, ["algorithm=dapo"]).algorithm.overlong_buffer_len == 12


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(write(tmp_path, "a: [1, 2\n"))
    with pytest.raises(ConfigError, match="key=value"):
        load_config(QUICKSTART, ["rollout.max_staleness"])


def test_flatten_hash_and_yaml_round_trip(tmp_path: Path) -> None:
    cfg = load_config(QUICKSTART)
    flat = flatten(cfg)
    assert flat["rollout.max_staleness"] == 4
    assert flat["data.synthetic.operations"] == '["+", "-", "*"]'
    assert config_hash(cfg) == config_hash(load_config(QUICKSTART))
    assert config_hash(cfg) != config_hash(load_config(QUICKSTART, ["rollout.max_staleness=1"]))
    # a data-only hash ignores RL knobs (used to cache data preparation)
    assert config_hash(cfg, ("data",)) == config_hash(
        load_config(QUICKSTART, ["rollout.max_staleness=1"]), ("data",)
    )
    # the printed YAML loads back to the same config
    again = load_config(write(tmp_path, to_yaml(cfg)))
    assert config_hash(again) == config_hash(cfg)


def test_the_run_hash_ignores_fields_that_do_not_change_the_run() -> None:
    cfg = load_config(QUICKSTART)
    neutral = ["checkpoint.recover=auto", "experiment.trial=x", "checkpoint.keep_last=5",
               "tracking.mlflow_uri=http://h:5000", "cluster.fileroot=s3://b/runs"]  # fmt: skip
    assert config_hash(load_config(QUICKSTART, neutral)) == config_hash(cfg)
    changed = load_config(QUICKSTART, ["algorithm.lr=3e-4", "checkpoint.recover=auto"])
    assert config_changes(run_params(cfg), changed) == [
        f"algorithm.lr: {cfg.algorithm.lr!r} -> 0.0003"
    ]
    # a checkpoint saved before the rollout split lists its sampling keys under rollout.*
    saved = {k.replace("sampling.", "rollout.", 1): v for k, v in run_params(cfg).items()}
    assert "rollout.temperature" in saved
    assert config_changes(saved, load_config(QUICKSTART, ["sampling.temperature=0.5"])) == [
        f"sampling.temperature: {cfg.sampling.temperature!r} -> 0.5"
    ]


def _run_folder(root: Path, trial: str) -> None:
    (root / "quickstart" / trial).mkdir(parents=True)
    (root / "quickstart" / trial / "config.yaml").write_text("{}")


def test_recover_auto_without_a_trial_resumes_the_latest_run(tmp_path: Path) -> None:
    def stamped(*overrides: str) -> str:
        cfg = load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}", *overrides])
        return stamp_trial(cfg).experiment.trial

    fresh = stamped("checkpoint.recover=auto")  # nothing to resume: a new timestamp
    assert len(fresh) == 15 and fresh[8] == "-"
    _run_folder(tmp_path, "20261130-090000")
    _run_folder(tmp_path, "20261201-080000")
    (tmp_path / "quickstart" / "_cache").mkdir()  # not a run folder
    assert stamped("checkpoint.recover=auto") == "20261201-080000"
    assert stamped("checkpoint.recover=auto", "experiment.trial=mine") == "mine"
    assert stamped() not in ("20261201-080000", "20261130-090000")  # recover=off: a new run
    _run_folder(tmp_path, "baseline")
    with pytest.raises(ConfigError, match=r"ambiguous.*\(baseline\).*experiment.trial"):
        stamped("checkpoint.recover=auto")


def test_every_field_is_documented() -> None:
    rows = field_docs()
    assert len(rows) > 60
    undocumented = [key for key, _, _, help_text in rows if not help_text.strip()]
    assert undocumented == []
    keys = {key for key, *_ in rows}
    assert {"rollout.max_staleness", "algorithm.eps_clip", "data.synthetic.direct_fraction"} <= keys


def test_docs_are_generated_from_the_schema() -> None:
    assert (ROOT / "docs" / "config.md").read_text() == docs_markdown(), (
        "run: asyncrl config docs > docs/config.md"
    )


def test_run_dir_layout() -> None:
    cfg = load_config(QUICKSTART, ["cluster.fileroot=s3://bucket/runs/", "experiment.trial=t1"])
    assert cfg.run_dir == "s3://bucket/runs/quickstart/t1"


def test_renamed_keys_are_read_as_the_new_ones_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="core.config.loading"):
        assert load_config(write(tmp_path, "actor:\n  total_steps: 3\n")).learner.total_steps == 3
        assert load_config(QUICKSTART, ["eval.batch_size=8"]).eval.max_concurrent == 8
    assert "config key 'actor' (in " in caplog.text and "is now 'learner'" in caplog.text
    assert "'eval.batch_size' (in command line) is now 'eval.max_concurrent'" in caplog.text
    with pytest.raises(
        ConfigError, match="'actor' \\(in command line\\) is now 'learner'; give only"
    ):
        load_config(QUICKSTART, ["actor.total_steps=3", "learner.total_steps=4"])


def test_a_config_written_before_the_rollout_split_loads_unchanged(tmp_path: Path) -> None:
    """rollout's engine, sampling, agent and tool keys moved to sections of their own: a file,
    an override or a variant naming the old keys means the same run as one naming the new."""
    old = write(
        tmp_path,
        "rollout:\n  batch_size: 4\n  max_new_tokens: 12\n  temperature: 0.5\n"
        "  kv_after_update: keep\n  agent: core.workflows.examples:calculator_agent\n"
        "  max_turns: 3\n  tool_latency_s: 0.5\n  tool_latency_p99_s: 2.0\n  sandbox: best_effort\n"
        "  workflow: core.workflows.openai_agent:OpenAIAgentWorkflow\n",
    )
    source = parse_config(old, ["rollout.top_k=5"])
    cfg = source.resolve({"rollout.tool_timeout_s": 7.0, "rollout.engine": "hf"})
    assert cfg.rollout.batch_size == 4
    assert (cfg.sampling.max_new_tokens, cfg.sampling.temperature, cfg.sampling.top_k) == (
        12,
        0.5,
        5,
    )
    assert cfg.inference.kv_after_update == "keep" and cfg.inference.engine == "hf"
    assert cfg.agent.function == "core.workflows.examples:calculator_agent"
    assert cfg.agent.max_turns == 3
    assert (cfg.tools.latency_s, cfg.tools.latency_p99_s, cfg.tools.timeout_s) == (0.5, 2.0, 7.0)
    assert cfg.tools.sandbox == "best_effort"
    new = load_config(
        None,
        ["rollout.batch_size=4", "sampling.max_new_tokens=12", "sampling.temperature=0.5",
         "sampling.top_k=5", "inference.kv_after_update=keep", "agent.max_turns=3",
         "agent.function=core.workflows.examples:calculator_agent", "tools.latency_s=0.5",
         "tools.latency_p99_s=2.0", "tools.sandbox=best_effort", "tools.timeout_s=7.0",
         "rollout.workflow=core.workflows.openai_agent:OpenAIAgentWorkflow"],
    )  # fmt: skip
    for section in ("rollout", "sampling", "inference", "agent", "tools"):
        assert getattr(cfg, section) == getattr(new, section), section
    # renamed once when read: the source holds the new keys, so each variant resolves them as is
    assert "max_new_tokens" not in source.layers[0][1]["rollout"]
    assert source.layers[0][1]["sampling"]["max_new_tokens"] == 12


def test_a_source_resolves_variants_without_reparsing(monkeypatch: pytest.MonkeyPatch) -> None:
    import core.config.loading as config_module

    reads: list[Path] = []
    read_yaml = config_module._read_yaml
    monkeypatch.setattr(config_module, "_read_yaml", lambda p: reads.append(p) or read_yaml(p))
    source = parse_config(QUICKSTART, ["algorithm.lr=1e-3", "rollout.max_staleness=2"])
    variants = {a: source.resolve({"algorithm": a, "experiment.seed": 5}) for a in ("ppo", "dapo")}
    assert len(reads) == 1
    # the variant's preset, then the file's and the command line's algorithm fields on top
    assert variants["ppo"].algorithm.use_critic and variants["ppo"].algorithm.lr == 1e-3
    assert variants["dapo"].algorithm.eps_clip_high == 0.28
    assert variants["dapo"].algorithm.group_size == 8  # the file's, over DAPO's 16
    assert {v.experiment.seed for v in variants.values()} == {5}
    assert all(v.rollout.max_staleness == 2 for v in variants.values())
    # resolving a variant leaves the source as it was, and equals parsing the same overrides
    assert config_hash(source.resolve()) == config_hash(
        load_config(QUICKSTART, ["algorithm.lr=1e-3", "rollout.max_staleness=2"])
    )
    assert config_hash(variants["ppo"]) == config_hash(
        load_config(
            QUICKSTART,
            ["algorithm.lr=1e-3", "rollout.max_staleness=2", "algorithm=ppo", "experiment.seed=5"],
        )
    )
    with pytest.raises(ConfigError, match="unknown config key 'rollout.max_stalenes'"):
        source.resolve({"rollout.max_stalenes": 1})
    stacked = source.with_values({"sft.enabled": False}, "warm start")
    assert not stacked.resolve().sft.enabled and source.resolve().sft.enabled


def test_every_config_dataclass_uses_the_one_help_idiom() -> None:
    import ast

    for module in (
        "core/config/sections.py",
        "core/algorithms/config.py",
        "core/data/synthetic.py",
    ):
        tree = ast.parse((ROOT / module).read_text())
        calls = {
            node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert "field" not in calls and "_f" not in calls and "_help" not in calls, module
        assert "documented" in calls, module


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.lr=nan", "algorithm.lr=nan must be a finite number"),
        ("sampling.temperature=nan", "sampling.temperature=nan must be a finite number"),
        ("algorithm.eps_clip=inf", "algorithm.eps_clip=inf must be a finite number"),
        ("sft.lr=-1", "sft.lr must be > 0"),
        ("rollout.max_failure_rate=-1", r"rollout.max_failure_rate must be in \[0, 1\]"),
        ("tools.timeout_s=-1", "tools.timeout_s must be > 0"),
        ("scheduler.torch_threads=0", "scheduler.torch_threads must be > 0"),
        ("rollout.reward_fn=core.rewards.gsm8k:gsm8k_rewrd", "rollout.reward_fn: .*no attribute"),
        ("rollout.reward_fn=no_such_module:f", "rollout.reward_fn: .*cannot import module"),
        ("rollout.reward_fn=core.rewards.gsm8k", "rollout.reward_fn: .*module.sub:attribute"),
        ("rollout.workflow=core.workflows.rlvr:RLVRWorkflo", "rollout.workflow: .*no attribute"),
        ("rollout.workflow=core.rollout.api:derive_seed", "rollout.workflow: .*from_config"),
    ],
)
def test_bad_values_and_plugins_fail_before_any_work(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(QUICKSTART, [override])


def test_a_moved_plugin_module_still_loads_and_names_its_new_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A config saved before core/workflows/ existed names core.rollout.agent: it loads the
    same class, with a warning that names the new module; an unknown module still fails."""
    from core.workflows.tagged_tools import ToolAgentWorkflow

    with caplog.at_level("WARNING", logger="core.plugins"):
        cfg = load_config(QUICKSTART, ["rollout.workflow=core.rollout.agent:ToolAgentWorkflow"])
    assert cfg.rollout.workflow == "core.rollout.agent:ToolAgentWorkflow"
    assert load_object(cfg.rollout.workflow) is ToolAgentWorkflow
    assert "is now 'core.workflows.tagged_tools'" in caplog.text
    with pytest.raises(ValueError, match="cannot import module 'core.rollout.agentz'"):
        load_object("core.rollout.agentz:ToolAgentWorkflow")


def test_fileroot_from_the_environment_only_when_left_at_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ASYNCRL_FILEROOT (what `asyncrl stack up` prints) replaces a fileroot left at `runs`:
    absent from the YAML or restated there as the shipped configs do; never one given on the
    command line, by a variant, or any other value in the YAML."""
    from core.config.loading import FILEROOT_ENV, fileroot_origin

    monkeypatch.delenv(FILEROOT_ENV, raising=False)
    assert load_config(QUICKSTART).cluster.fileroot == "runs"
    assert fileroot_origin(load_config(QUICKSTART)) == "cluster.fileroot"

    monkeypatch.setenv(FILEROOT_ENV, "s3://stack/runs")
    from_env = load_config(QUICKSTART)  # its YAML says `fileroot: runs`
    assert from_env.cluster.fileroot == "s3://stack/runs"
    assert from_env.run_dir.startswith("s3://stack/runs/quickstart/")
    assert "from ASYNCRL_FILEROOT" in fileroot_origin(from_env)
    assert load_config(None).cluster.fileroot == "s3://stack/runs"
    assert load_config(write(tmp_path, "sft:\n  steps: 3\n")).cluster.fileroot == "s3://stack/runs"

    explicit = load_config(QUICKSTART, ["cluster.fileroot=runs"])
    assert explicit.cluster.fileroot == "runs"
    assert "ASYNCRL_FILEROOT is not used" in fileroot_origin(explicit)
    assert load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}"]).cluster.fileroot == str(
        tmp_path
    )
    assert load_config(write(tmp_path, "cluster:\n  fileroot: /data/runs\n")).cluster.fileroot == (
        "/data/runs"
    )
    source = parse_config(QUICKSTART, ["sft.steps=3"])
    assert source.resolve({"experiment.seed": 2}).cluster.fileroot == "s3://stack/runs"
    assert source.resolve({"cluster.fileroot": "runs"}).cluster.fileroot == "runs"
    assert source.with_values({"sft.enabled": False}).resolve().cluster.fileroot == (
        "s3://stack/runs"
    )

    monkeypatch.setenv(FILEROOT_ENV, "")  # set but empty: not a fileroot
    assert load_config(QUICKSTART).cluster.fileroot == "runs"


def test_yaml_11_words_stay_text_in_text_fields() -> None:
    """`off`/`yes` are booleans to YAML 1.1: a text field keeps what was typed, a bool reads it."""
    cfg = load_config(
        QUICKSTART, ["experiment.trial=off", "data.system_prompt=yes", "tracking.tensorboard=off"]
    )
    assert (cfg.experiment.trial, cfg.data.system_prompt) == ("off", "yes")
    assert cfg.tracking.tensorboard is False


@pytest.mark.unit
@pytest.mark.parametrize("preset", ["grpo", "ppo", "dapo"])
def test_every_recipe_loads_under_the_presets_an_ablation_compares(preset: str) -> None:
    """``asyncrl ablate`` runs a recipe under each preset: a DAPO overlong buffer longer than the
    recipe's responses (the preset's 4,096 against 48 tokens) used to fail only there."""
    recipes = sorted((ROOT / "experiments").glob("*.yaml"))
    assert len(recipes) >= 10
    for recipe in recipes:
        cfg = load_config(recipe, [f"algorithm={preset}"])
        assert cfg.algorithm.name == preset, recipe.name
