"""The experiment schema: one dataclass per section, every field ``documented``.

:class:`Config` is the whole experiment; its sections are grouped by purpose after TRL's configs.
Loading, layering and validation live in :mod:`core.config.loading`.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.algorithms.config import AlgorithmConfig
from core.algorithms.preference import DPO_KINDS
from core.data.code_synthetic import CodeSpec
from core.data.copy_drills import COPY_DRILL_TURNS
from core.data.humaneval import HumanEvalSpec
from core.data.preference import PreferenceSpec
from core.data.prompting import PROMPT_FORMATS
from core.data.reasoning_gym import ReasoningGymSpec
from core.data.synthetic import SyntheticSpec
from core.schema import documented
from core.workflows.search_data import SearchSpec
from core.workflows.support_data import SupportSpec
from core.workflows.terminal_data import TerminalSpec
from core.workflows.textarena_game import TextArenaSpec
from core.workflows.verifiers_env import VerifiersSpec


class ConfigError(ValueError):
    """A user-caused configuration problem; the message names the key, file or value."""


@dataclass
class ExperimentConfig:
    """Names and seeds: where a run's outputs go is ``{cluster.fileroot}/{name}/{trial}``."""

    name: str = documented(
        "quickstart", "Experiment name; groups runs in the output folder and in MLflow."
    )
    trial: str = documented(
        "",
        "Trial name inside the experiment (the run folder); empty = a timestamp chosen at start, "
        "or with checkpoint.recover=auto the experiment's latest run (the only one, or the newest "
        "timestamped one; an error if named trials make it ambiguous).",
    )
    seed: int = documented(
        1,
        "Seed for model initialisation, sampling and shuffling, and for data generation unless "
        "data.seed is set.",
    )
    description: str = documented("", "Free text recorded with the run.")


@dataclass
class ClusterConfig:
    """Where the run's files live and how many machines it spans."""

    fileroot: str = documented(
        "runs",
        "Root for run outputs and checkpoints: a local folder or any fsspec URL (s3://bucket/prefix). "
        "Left at this default (not given on the command line; a YAML file may restate 'runs'), "
        "the environment variable ASYNCRL_FILEROOT replaces it when set (asyncrl stack up prints "
        "it: the stack's bucket); the run logs which one it used.",
    )
    n_nodes: int = documented(1, "Number of machines (Ray nodes) the run spans.", gt=0)
    n_gpus_per_node: int = documented(0, "GPUs per node; 0 runs everything on CPU.", ge=0)
    ray_address: str = documented(
        "", "Address of an existing Ray cluster to join; empty starts a local one."
    )
    lock_stale_s: float = documented(
        120.0,
        "A run folder is locked while its job runs (LOCK file with owner and heartbeat); another "
        "job takes a lock over when its owner on this host has exited, or after this many seconds "
        "without a heartbeat from another host.",
        gt=0,
    )


@dataclass
class SchedulerConfig:
    """How the rollout and learner processes are placed."""

    type: str = documented(
        "local",
        "'local' (plain processes, for debugging) or 'ray' (Ray actors).",
        choices=("local", "ray"),
    )
    learner_cpus: float = documented(1.0, "CPUs reserved for the learner group (Ray).", gt=0)
    rollout_cpus: float = documented(1.0, "CPUs reserved for the rollout side (Ray).", gt=0)
    torch_threads: int = documented(
        1, "torch.set_num_threads per process: each side on its own core(s), or they fight.", gt=0
    )
    server_cpus: float = documented(
        1.0, "CPUs reserved for each inference server the run launches (Ray).", gt=0
    )
    server_resource: str = documented(
        "",
        "A custom Ray resource the nodes for inference servers advertise (ray start --resources "
        "'{\"NAME\": 1}'); each server asks a sliver of it, so they go only there. Empty = any node.",
    )
    learner_resource: str = documented(
        "", "The same for the learner ranks' nodes. Empty = any node."
    )
    learner_spread: bool = documented(
        False,
        "Place learner ranks on different nodes (Ray placement group SPREAD); default PACK: "
        "as few nodes as fit them.",
    )


@dataclass
class ModelConfig:
    """The policy model and its tokenizer."""

    path: str = documented(
        "tiny",
        "A from-scratch preset ('tiny' ~1M, 'small' ~10M, 'medium' ~97M params), a local HF folder, or a hub id.",
    )
    tokenizer_path: str = documented(
        "",
        "Tokenizer folder or hub id; empty = the model's (presets train a BPE tokenizer on the training data).",
    )
    vocab_size: int = documented(
        400, "Vocabulary size of the tokenizer trained for a preset model.", gt=0
    )
    dtype: str = documented(
        "float32",
        "Parameter dtype: float32 (CPU), bfloat16 or float16 (GPU).",
        choices=("float32", "bfloat16", "float16"),
    )
    attn_implementation: str = documented(
        "sdpa",
        "Attention kernel: 'sdpa' (CPU/GPU), 'flash_attention_2' (GPU, gpu extra), 'eager'.",
        choices=("sdpa", "eager", "flash_attention_2"),
    )
    lora_rank: int = documented(
        0,
        "LoRA rank of the RL policy (https://arxiv.org/abs/2106.09685, through peft): 0 trains "
        "all weights; r > 0 freezes the model and trains rank-r adapters on "
        "model.lora_target_modules. Engines receive the merged weights; checkpoints and exports "
        "also hold the adapter (adapter/). The SFT warm start and the critic train all weights.",
        ge=0,
    )
    lora_alpha: float = documented(
        16.0, "LoRA scaling: the adapters' update is multiplied by lora_alpha / lora_rank.", gt=0
    )
    lora_target_modules: list[str] = documented(
        ["all-linear"],
        "Linear modules that get adapters, by name or name suffix as peft matches them (e.g. "
        "[q_proj, v_proj]); [all-linear] = every linear layer except the output layer.",
    )
    lora_dropout: float = documented(
        0.0, "Dropout on the adapters' input while training, in [0, 1) (LoRA only)."
    )


@dataclass
class DataConfig:
    """Training and held-out problems."""

    source: str = documented(
        "synthetic",
        "'synthetic' (generated GSM8K-style problems), 'code_synthetic' (generated function-"
        "writing problems with tests, for core.rewards.code), 'search_synthetic' (multi-hop "
        "questions over a generated corpus, for the search agent), 'humaneval' (HumanEval's 164 "
        "problems, for core.rewards.humaneval), 'reasoning_gym' (reasoning-gym's procedural tasks, "
        "for core.rewards.reasoning_gym), 'textarena' (seeded games of a textarena single-player "
        "game, for the agent core.workflows.textarena_game:play), 'verifiers' (a verifiers "
        "environment's rows, for the agent core.workflows.verifiers_env:play), 'customer_service' "
        "(simulated customers with a hidden goal and their orders, for the agent "
        "core.workflows.support_agent:serve), 'terminal' (files and questions or chores about "
        "them, for the bash agent core.workflows.terminal_agent:serve), 'gsm8k', "
        "'dataset' (any "
        "tabular data: data.path and the column keys), or a 'module:function' path to a source "
        "registered with @data_source (core/data/sources.py).",
    )
    seed: int | None = documented(
        None,
        "Seed of the generated problems (and of the corpus, the test_ratio split); None = "
        "experiment.seed. Fix it to repeat RL over the same problems with other experiment seeds.",
    )
    gsm8k_path: str = documented(
        "bundled",
        "For source=gsm8k: 'bundled' (the repo's copy), 'hub' (openai/gsm8k), or a file/folder path or fsspec URL with {split}.jsonl|parquet.",
    )
    prompt_format: str = documented(
        "template",
        "'template' (data.template as text, the tokenizer's own special tokens) or 'chat' (the "
        "tokenizer's chat template over data.system_prompt and a user turn holding data.template; "
        "generation also stops at the template's end-of-turn token).",
        choices=PROMPT_FORMATS,
    )
    template: str = documented(
        "plain",
        "Prompt text: a name in core.data.templates ('plain', 'gsm8k_cot') or a format string "
        "with a {question} placeholder.",
    )
    system_prompt: str = documented("", "prompt_format=chat: a system message; empty = none.")
    stop_strings: list[str] = documented(
        help="Generation (rollout, eval, the tool agent) also ends after any of these strings, "
        "besides EOS and the chat template's end-of-turn token; the string's tokens stay in the "
        "completion. Up to 16, each 1-256 characters. SGLang needs its tokenizer for them (not "
        "--skip-tokenizer-init); with any engine the completion is cut after the first one.",
        factory=list,
    )
    n_train: int = documented(
        4000, "Training problems (synthetic: generated; gsm8k: the first n, 0 = all).", ge=0
    )
    n_test: int = documented(
        1000,
        "Held-out problems (synthetic: generated; gsm8k: the first n of the test split, 0 = all).",
        ge=0,
    )
    path: str = documented(
        "",
        "source=dataset: a hub id, a save_to_disk folder, or a JSONL/parquet/CSV file or a folder "
        "of {split}.<ext> files, at any fsspec URL.",
    )
    test_path: str = documented(
        "", "source=dataset: where the eval set comes from (another dataset); empty = data.path."
    )
    train_split: str = documented("train", "source=dataset: the training split.")
    test_split: str = documented("test", "source=dataset: the eval split (unless test_ratio).")
    test_ratio: float = documented(
        0.0,
        "source=dataset: hold out this share of the training split (seeded) as the eval set "
        "instead of test_split; 0 = use test_split.",
        ge=0,
        le=1,
    )
    prompt_key: str = documented("question", "source=dataset: the column holding the prompt.")
    answer_key: str = documented(
        "answer", "source=dataset: the column holding the reference answer the reward checks."
    )
    system_key: str = documented(
        "", "source=dataset: a column with a per-sample system prompt (chat format); '' = none."
    )
    id_key: str = documented("", "source=dataset: a column with stable sample ids; '' = row index.")
    metadata_keys: list[str] = documented(
        help="source=dataset: columns carried into each sample unchanged.", factory=list
    )
    max_prompt_tokens: int = documented(
        0,
        "Drop samples whose prompt (as the model sees it) is longer than this many tokens, "
        "counted per split in the summary; 0 = keep all.",
        ge=0,
    )
    strict: bool = documented(False, "Raise on a bad row instead of skipping it with a warning.")
    synthetic: SyntheticSpec = documented(
        help="Synthetic problem generator knobs.", factory=SyntheticSpec
    )
    code_synthetic: CodeSpec = documented(
        help="source=code_synthetic: synthetic code problem generator knobs.", factory=CodeSpec
    )
    search_synthetic: SearchSpec = documented(
        help="source=search_synthetic: the generated corpus and its multi-hop questions.",
        factory=SearchSpec,
    )
    humaneval: HumanEvalSpec = documented(
        help="source=humaneval: where HumanEval's problems come from and how many are trained on.",
        factory=HumanEvalSpec,
    )
    reasoning_gym: ReasoningGymSpec = documented(
        help="source=reasoning_gym: which reasoning-gym tasks, mixed how, with which settings.",
        factory=ReasoningGymSpec,
    )
    textarena: TextArenaSpec = documented(
        help="source=textarena: which textarena game, with which settings.",
        factory=TextArenaSpec,
    )
    verifiers: VerifiersSpec = documented(
        help="source=verifiers: which verifiers environment, with which arguments.",
        factory=VerifiersSpec,
    )
    customer_service: SupportSpec = documented(
        help="source=customer_service: the simulated customers' goals and orders, and the "
        "SFT conversations' mix.",
        factory=SupportSpec,
    )
    terminal: TerminalSpec = documented(
        help="source=terminal: the task kinds, their files and the SFT conversations' mix.",
        factory=TerminalSpec,
    )


@dataclass
class SFTConfig:
    """Supervised warm start on the training solutions before RL."""

    enabled: bool = documented(
        True, "Run the SFT warm start (preset models start from random weights)."
    )
    steps: int = documented(600, "Optimizer steps.", ge=0)
    batch_size: int = documented(32, "Sequences per optimizer step.", gt=0)
    lr: float = documented(2e-3, "Peak learning rate (AdamW).", gt=0)
    warmup_steps: int = documented(30, "Linear warm-up steps before the cosine decay.", ge=0)
    min_lr_ratio: float = documented(
        0.1, "Final learning rate as a fraction of the peak.", ge=0, le=1
    )
    weight_decay: float = documented(0.0, "AdamW weight decay.", ge=0)
    max_grad_norm: float = documented(1.0, "Gradient clipping norm.", ge=0)
    copy_drill_steps: int = documented(
        0,
        "Optimizer steps of copy drills before the SFT steps (0: none): a training "
        "conversation's assistant turn (sft.copy_drill_turns) and what it reads, with what the "
        "turn copies from there renamed at random and the loss on the copies (core/data/"
        "copy_drills.py). A from-scratch preset learns here to copy a name, file or number out "
        "of the request into a tool call, which a pretrained model already can.",
        ge=0,
    )
    copy_drill_batch_size: int = documented(64, "Drills per copy-drill step.", gt=0)
    copy_drill_window: int = documented(
        128,
        "Tokens of the request a drill keeps, and for a later turn (copy_drill_turns=all) "
        "also the tokens right before it (what it reads).",
        gt=0,
    )
    copy_drill_turns: str = documented(
        "first",
        "Which assistant turns are drilled: 'first' (copies out of the request: the search "
        "query's entity, the order number) or 'all' (also later turns' copies out of tool "
        "output: a path grep printed, a doc id a search returned).",
        choices=COPY_DRILL_TURNS,
    )
    copy_drill_first_share: float | None = documented(
        None,
        "With copy_drill_turns=all, the share of drills that are first turns (null: one in as "
        "many as an episode has turns). The first turn's copy out of the request is its own "
        "skill: drilled one time in three among a search episode's turns, it did not form.",
        ge=0,
        le=1,
    )
    copy_drill_first_steps: int = documented(
        0,
        "Of the copy_drill_steps, how many come first and drill first turns only; the rest "
        "follow sft.copy_drill_turns and sft.copy_drill_first_share; each phase has a "
        "learning-rate schedule of its own, as two drill runs would. Drilled together from "
        "scratch, the first turn's copy and the later turns' copies out of tool output did not "
        "form; in two runs, one after the other, they did in part; when a copy forms also "
        "depends on the seed (docs/tutorials/own-agent.md).",
        ge=0,
    )

    def __post_init__(self) -> None:
        if self.copy_drill_first_steps > self.copy_drill_steps:
            raise ValueError(
                f"sft.copy_drill_first_steps ({self.copy_drill_first_steps}) must not exceed "
                f"sft.copy_drill_steps ({self.copy_drill_steps})"
            )


@dataclass
class DPOConfig:
    """Direct preference optimisation after the warm start (Rafailov et al., arXiv 2305.18290):
    the policy against a frozen copy of itself on the ``preference`` pairs."""

    enabled: bool = documented(False, "Run the DPO stage (after SFT, before RL or the eval).")
    eval_start: bool = documented(
        True,
        "Also evaluate the task's held-out accuracy before DPO (the summary's accuracy_before), "
        "as eval.* evaluates it after.",
    )
    loss: str = documented(
        "sigmoid", "'sigmoid' (DPO) or 'ipo' (Azar et al., arXiv 2310.12036).", choices=DPO_KINDS
    )
    beta: float = documented(
        0.1, "β: how far the policy may move from the reference (smaller = further).", gt=0
    )
    nll_coef: float = documented(
        0.0,
        "Weight of the chosen answers' per-token NLL added to the loss (RPO, Pang et al., arXiv "
        "2404.19733): keeps them likely when rejected answers share most of their tokens.",
        ge=0,
    )
    steps: int = documented(100, "Optimizer steps.", ge=0)
    batch_size: int = documented(16, "Pairs per optimizer step.", gt=0)
    lr: float = documented(2e-4, "Peak learning rate (AdamW).", gt=0)
    warmup_steps: int = documented(10, "Linear warm-up steps before the cosine decay.", ge=0)
    min_lr_ratio: float = documented(
        0.1, "Final learning rate as a fraction of the peak.", ge=0, le=1
    )
    weight_decay: float = documented(0.0, "AdamW weight decay.", ge=0)
    max_grad_norm: float = documented(1.0, "Gradient clipping norm.", ge=0)


@dataclass
class RewardModelConfig:
    """A reward model trained on the ``preference`` pairs (Bradley–Terry, InstructGPT arXiv
    2203.02155): the warm-started model's backbone with a scalar head, the reward read at an
    answer's last token."""

    enabled: bool = documented(
        False, "Run the reward-model stage (after SFT); its folder is {run_dir}/reward_model."
    )
    use_in_rl: bool = documented(
        False,
        "Score RL rollouts with the reward model (the RLVR workflow): reward = reward_model.coef "
        "× its score + reward_model.task_coef × rollout.reward_fn's. Evaluation still reports "
        "rollout.reward_fn's accuracy.",
    )
    path: str = documented(
        "",
        "The reward model RL uses: a folder (or URL) a reward-model stage wrote; '' = this run's "
        "({run_dir}/reward_model, needs reward_model.enabled).",
    )
    coef: float = documented(1.0, "Weight of the reward model's score in the RL reward.")
    task_coef: float = documented(
        0.0,
        "Weight of rollout.reward_fn's reward in the RL reward: 0 = the reward model alone (the "
        "task reward is still computed, logged and evaluated).",
    )
    steps: int = documented(100, "Optimizer steps.", ge=0)
    batch_size: int = documented(16, "Pairs per optimizer step.", gt=0)
    lr: float = documented(1e-3, "Peak learning rate (AdamW).", gt=0)
    warmup_steps: int = documented(10, "Linear warm-up steps before the cosine decay.", ge=0)
    min_lr_ratio: float = documented(
        0.1, "Final learning rate as a fraction of the peak.", ge=0, le=1
    )
    weight_decay: float = documented(0.0, "AdamW weight decay.", ge=0)
    max_grad_norm: float = documented(1.0, "Gradient clipping norm.", ge=0)


@dataclass
class RolloutConfig:
    """The async loop: batches, the staleness bound, episodes in flight, their workflow and
    reward, and when to give up."""

    batch_size: int = documented(
        16, "Prompts per training step (each sampled group_size times).", gt=0
    )
    max_staleness: int = documented(
        4,
        "Staleness bound η: a sample may be at most η weight versions old; 0 = synchronous RL.",
        ge=0,
    )
    adaptive_staleness: bool = documented(
        False,
        "Run only as far ahead as the learner needs: rollouts are admitted under a working bound "
        "that starts at 1, rises (up to max_staleness) after a step whose batch the learner had "
        "to wait for, and falls after a step that found a whole spare batch ready. Data is never "
        "older than max_staleness either way; off = always admit up to max_staleness.",
    )
    max_concurrent: int = documented(64, "Most episodes in flight at once.", gt=0)
    workflow: str = documented(
        "core.workflows.rlvr:RLVRWorkflow", "Episode workflow, by import path."
    )
    reward_fn: str = documented(
        "core.rewards.gsm8k:gsm8k_reward",
        "Reward function (completion, reference) -> float, by import path.",
    )
    reward_workers: int = documented(
        0,
        "Score rewards in this many verifier processes, off the rollout event loop, each call "
        "bounded by reward_timeout_s (for slow or untrusted verifiers: math-verify, code tests); "
        "0 = call the reward inline (fast rewards).",
        ge=0,
    )
    reward_timeout_s: float = documented(
        10.0,
        "With reward_workers: a call past this many seconds scores 0 (counted, process replaced).",
        gt=0,
    )
    max_failure_rate: float = documented(
        0.2, "Stop the run when more than this share of episodes fail.", ge=0, le=1
    )
    max_filtered_in_a_row: int = documented(
        256,
        "Stop the run when the group filter (DAPO's dynamic sampling) refuses this many groups "
        "in a row (a warning every rollout.batch_size of them); 0 = never stop.",
        ge=0,
    )
    stall_warn_s: float = documented(
        60.0,
        "While the learner waits this long for a batch, log what the rollout is waiting for "
        "(ready and running groups, versions, filter and failure counts), and again after each "
        "further period.",
        gt=0,
    )
    stall_timeout_s: float = documented(
        3600.0, "Stop the run when no batch is ready after this many seconds of waiting.", gt=0
    )
    episode_timeout_s: float = documented(
        600.0,
        "An RL episode still running after this many seconds (a tool or an environment that "
        "hangs) is cancelled and its group counts as failed (rollout/episodes_timed_out, a "
        "warning; toward rollout.max_failure_rate): it never holds a slot forever. 0 = no limit.",
        ge=0,
    )


@dataclass
class InferenceConfig:
    """Where completions are generated: our engine or inference servers, and how they take
    new weights."""

    engine: str = documented(
        "hf",
        "'hf' (our engine inside the rollout worker, CPU/GPU), 'sglang' (servers speaking "
        "SGLang's HTTP API: launched by the run, or running ones) or 'vllm' (running servers).",
        choices=("hf", "sglang", "vllm"),
    )
    server_addresses: list[str] = documented(
        [],
        "host:port of running inference servers for inference.engine=sglang|vllm; the run brings "
        "them to its starting weights first. Empty with sglang = the run launches "
        "inference.n_servers servers itself (required with vllm; unused with hf).",
    )
    n_servers: int = documented(
        1,
        "Inference servers the run launches (inference.engine=sglang, no server_addresses).",
        gt=0,
    )
    server_launcher: str = documented(
        "asyncrl",
        "What the run launches: 'asyncrl' (our engine server, python -m core.inference.server, "
        "CPU or CUDA) or 'sglang' (python -m sglang.launch_server, a GPU node).",
        choices=("asyncrl", "sglang"),
    )
    weight_sync: str = documented(
        "disk",
        "How new weights reach servers (inference.engine=sglang): 'disk' (a HF folder under the "
        "run folder; uploaded and fetched when that is s3:// etc.) or 'distributed' (broadcast "
        "from the learner's rank 0 over a process group, SGLang's update_weights_from_distributed; "
        "gloo on CPU, nccl with GPUs).",
        choices=("disk", "distributed"),
    )
    server_python: str = documented(
        "",
        "Interpreter of the launched servers (SGLang pins its own torch: point this at its "
        "environment); empty = this one.",
    )
    max_batch_rows: int = documented(
        0,
        "Most requests an engine decodes together: the in-process one (inference.engine=hf), or "
        "each server the run launches (sglang without server_addresses: SGLang's "
        "--max-running-requests with priority scheduling, lowest first); 0 = rollout.max_concurrent. "
        "Below the number of calls waiting, the oldest groups' calls go first, so groups "
        "finish in about the order they started instead of all advancing together (with many "
        "episodes in flight, every group then reaches the staleness bound at once).",
        ge=0,
    )
    prefix_cache_tokens: int = documented(
        131_072,
        "Tokens of finished requests' KV cache the in-process engine keeps, so a request that "
        "continues one (an agent's next call) prefills only its new tokens; 0 = off. Cleared "
        "on every weight update unless inference.kv_after_update=keep.",
        ge=0,
    )
    kv_after_update: str = documented(
        "recompute",
        "What the engine does with KV caches when new weights load: 'recompute' (AReaL: "
        "running requests abort and are resubmitted, kept caches are dropped; each prefills its "
        "conversation again under the new weights) or 'keep' (PipelineRL's in-flight update: "
        "conversations continue on keys and values computed by older weights, and on the "
        "in-process engine running requests stay in the batch across the update, so later "
        "tokens are sampled from a mix of versions; their recorded log-probs are the ones "
        "sampled with, so the behaviour weights stay exact). Our engines only "
        "(inference.engine=hf, or server_launcher=asyncrl).",
        choices=("recompute", "keep"),
    )


@dataclass
class SamplingConfig:
    """How completions are sampled (RL rollouts; the learner scales its logits the same way)."""

    max_new_tokens: int = documented(64, "Generation budget per completion.", gt=0)
    temperature: float = documented(
        1.0, "Sampling temperature (the learner scales its logits the same way)."
    )
    top_p: float = documented(1.0, "Nucleus sampling; 1.0 = off.")
    top_k: int = documented(0, "Top-k sampling; 0 = off.", ge=0)


@dataclass
class AgentConfig:
    """Multi-turn episodes: the agent function and what one episode trains as."""

    function: str = documented(
        "",
        "Agent workflow (core.workflows.openai_agent:OpenAIAgentWorkflow): the async function that plays "
        "an episode with an OpenAI-shaped client, by import path (module:function).",
    )
    max_turns: int = documented(
        4, "Tool-agent and agent workflows: most model turns (completion calls) per episode.", gt=0
    )
    trajectory_mode: str = documented(
        "conversation",
        "Agent workflow: what one episode trains as. 'conversation': one trajectory, model tokens "
        "trained and the rest masked (a new one starts where the agent rewrote its history); "
        "'per_turn': one trajectory per completion call, its prompt masked. Group advantages "
        "(grpo, rloo) count each episode once either way.",
        choices=("conversation", "per_turn"),
    )


@dataclass
class ToolsConfig:
    """Tools of the tagged-tool and agent workflows, and the sandbox that runs model-written
    code (their tools and code rewards)."""

    latency_s: float = documented(
        0.0,
        "Tool-agent and agent workflows: simulated latency per tool call (models remote "
        "tools/APIs); with latency_p99_s, the median of a long-tailed (log-normal) latency.",
        ge=0,
    )
    latency_p99_s: float = documented(
        0.0,
        "Agent workflow tools that draw latencies (the search agent): the 99th percentile of a "
        "log-normal latency whose median is latency_s (sigma = ln(p99/median)/2.3263), "
        "drawn per call, seeded per episode; 0 = no tail, every call takes latency_s. "
        "Must be >= latency_s > 0 when set.",
        ge=0,
    )
    timeout_s: float = documented(
        5.0,
        "Wall-time limit of one sandboxed python call: the tool agent's python tool, and the "
        "test run of a reward that runs code (core.rewards.code); also the per-call limit of the "
        "search agent's tools, past which a call returns a timeout error.",
        gt=0,
    )
    sandbox: str = documented(
        "strict",
        "When the kernel lacks a sandbox feature for model-written code (the tool agent's python "
        "tool, the tests of core.rewards.code) (user/PID/network/IPC/mount namespaces, seccomp): "
        "'strict' refuses to run the code, "
        "naming what is missing; 'best_effort' runs it with what exists and warns once.",
        choices=("strict", "best_effort"),
    )


@dataclass
class LearnerConfig:
    """The learner that trains the policy."""

    n_ranks: int = documented(1, "Data-parallel FSDP2 ranks (processes).", gt=0)
    micro_batch_tokens: int = documented(
        8192, "Token budget of one micro-batch (gradient accumulation splits above it).", gt=0
    )
    pack_sequences: bool = documented(
        False,
        "Pack each micro-batch's sequences end to end (position ids restart per sequence, a "
        "block-diagonal causal mask) instead of padding rows, in the policy's and reference's "
        "passes (the critic stays padded): for varlen attention "
        "(model.attn_implementation=flash_attention_2) on GPUs. Off on CPU, where SDPA gets a "
        "dense block mask and measured no faster (experiments/benchmarks/learner_packing.py). "
        "Turns share_prompts off.",
    )
    share_prompts: bool = documented(
        True,
        "Run each distinct prompt of a micro-batch through the policy and reference once and "
        "let its samples' tokens attend to its KV cache (gradients flow back through it), "
        "instead of once per sample: the same numbers (up to floating-point order; dropout draws "
        "one mask per prompt) in fewer positions "
        "(core/training/shared_prompts.py; a GRPO group of G samples computes its prompt once). "
        "RL only; off under pack_sequences, and the critic stays padded.",
    )
    total_steps: int = documented(40, "RL training steps (weight versions).", ge=0)
    mismatch_tolerance: float = documented(
        1e-3,
        "Train/inference mismatch check: a trained token generated at the learner's version "
        "counts as mismatched when |log π_learner - log π_engine| exceeds this "
        "(core/training/mismatch.py; measured on CPU fp32: at most ~1e-5). Low-precision "
        "engines on GPU need a larger value.",
        gt=0,
    )
    mismatch_warn_frac: float | None = documented(
        0.01,
        "Warn, naming the worst sample and position, when more than this share of the checked "
        "tokens of a step is mismatched; None = never warn (the metrics are logged anyway).",
        ge=0,
        le=1,
    )


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

    n_problems: int = documented(
        1000, "Held-out problems evaluated (<= data.n_test; 0 = all).", ge=0
    )
    max_concurrent: int = documented(
        128,
        "Most held-out episodes in flight at once (the engine batches what is in flight).",
        gt=0,
    )
    max_new_tokens: int = documented(64, "Generation budget per answer.", gt=0)
    every_n_steps: int = documented(
        10, "Evaluate every N RL steps (0 = only before and after).", ge=0
    )
    n_train_problems: int = documented(
        0,
        "Training problems also evaluated, greedily, at each RL eval (the first N; 0 = none): "
        "eval/train_accuracy beside eval/accuracy. A gap that opens under RL is what the "
        "policy memorised of the questions it trains on rather than learned.",
        ge=0,
    )
    at_start: bool = documented(
        True,
        "Evaluate the starting policy before RL (accuracy_before); false skips it, and the "
        "summary's accuracy_before is then empty. The run always evaluates at its end.",
    )
    n_samples: int = documented(
        0,
        "Sampled answers per problem, besides the greedy one behind accuracy, for pass@k and "
        "mean@k (k = 1 and n_samples); 0 = none.",
        ge=0,
    )
    temperature: float = documented(
        1.0, "Sampling temperature of those answers (plain sampling: no top-p/top-k)."
    )
    episode_timeout_s: float = documented(
        600.0,
        "An eval episode still running after this many seconds (a tool that hangs) is cancelled, "
        "scores 0 and is counted (eval/timed_out): an evaluation never waits forever.",
        gt=0,
    )


@dataclass
class CheckpointConfig:
    """Checkpoints for exact resume."""

    url: str = documented(
        "", "Where checkpoints go (any fsspec URL); empty = {run_dir}/checkpoints."
    )
    every_n_steps: int = documented(
        20,
        "Checkpoint every N RL steps (0 = only at the end); the reward-model and DPO stages "
        "also every N of their steps (their checkpoints are removed when the stage finishes).",
        ge=0,
    )
    keep_last: int = documented(2, "Committed checkpoints to keep.", gt=0)
    on_signal: bool = documented(
        False,
        "On SIGTERM/SIGINT during RL, commit a final checkpoint before stopping when the loop is "
        "waiting for a batch (the learner idle); a signal during an update writes none.",
    )
    recover: str = documented(
        "off",
        "'off' or 'auto': resume from the newest valid committed checkpoint (a torn or corrupt "
        "one is skipped with a warning); without experiment.trial, of the latest run. The "
        "stages before RL (SFT, reward model, DPO) that the run finished are reused unless "
        "their settings changed, and a reward-model or DPO stage stopped midway goes on from "
        "its own checkpoint.",
        choices=("off", "auto"),
    )


@dataclass
class WatchdogConfig:
    """The driver's waits on its workers: named while they last, and never forever."""

    warn_s: float = documented(
        60.0,
        "While the driver waits this long on a worker call (an evaluation, an SFT step, an RL "
        "update, publishing weights, a checkpoint or export), log what it waits for and for how "
        "long, and again after each further period. The batch wait logs its own, more detailed "
        "line (rollout.stall_warn_s).",
        gt=0,
    )
    timeout_s: float = documented(
        3600.0,
        "Stop the run with an error naming the call when a worker call takes longer than this "
        "(0 = no limit). The batch wait's limit is rollout.stall_timeout_s (plus warn_s for the "
        "worker to say why first); evaluation episodes are also bounded one by one "
        "(eval.episode_timeout_s), RL episodes by rollout.episode_timeout_s.",
        ge=0,
    )


@dataclass
class TrackingConfig:
    """Experiment tracking."""

    mlflow_uri: str = documented(
        "",
        "MLflow tracking URI (a server such as http://127.0.0.1:5000, or any store URI); empty = "
        "the MLFLOW_TRACKING_URI environment variable when set (asyncrl stack up prints it), else "
        "an embedded sqlite store: {cluster.fileroot}/mlflow.db for a local fileroot, a local "
        "cache folder for a remote one. The run logs which one it used.",
    )
    mlflow_experiment: str = documented("", "MLflow experiment name; empty = experiment.name.")
    tensorboard: bool = documented(
        True,
        "Also write the metrics (the keys and steps MLflow gets) as TensorBoard event files in "
        "{run_dir}/tensorboard, flushed at every step (a remote fileroot's go to a local staging "
        "folder, uploaded by the report stage), and log them to the MLflow run under "
        "tensorboard/. View: tensorboard --logdir {cluster.fileroot} (or a run folder).",
    )


@dataclass
class Config:
    """A whole experiment."""

    experiment: ExperimentConfig = documented(help="Names and seeds.", factory=ExperimentConfig)
    cluster: ClusterConfig = documented(help="Files and machines.", factory=ClusterConfig)
    scheduler: SchedulerConfig = documented(help="Process placement.", factory=SchedulerConfig)
    model: ModelConfig = documented(help="Policy model and tokenizer.", factory=ModelConfig)
    data: DataConfig = documented(help="Training and held-out data.", factory=DataConfig)
    sft: SFTConfig = documented(help="Supervised warm start.", factory=SFTConfig)
    preference: PreferenceSpec = documented(
        help="Preference pairs (for DPO and the reward model).", factory=PreferenceSpec
    )
    dpo: DPOConfig = documented(help="Preference optimisation (DPO).", factory=DPOConfig)
    reward_model: RewardModelConfig = documented(
        help="Reward model (Bradley–Terry).", factory=RewardModelConfig
    )
    rollout: RolloutConfig = documented(help="The async loop and staleness.", factory=RolloutConfig)
    inference: InferenceConfig = documented(help="Engines and servers.", factory=InferenceConfig)
    sampling: SamplingConfig = documented(help="Sampling settings.", factory=SamplingConfig)
    agent: AgentConfig = documented(help="Multi-turn agent episodes.", factory=AgentConfig)
    tools: ToolsConfig = documented(help="Agent tools and the sandbox.", factory=ToolsConfig)
    algorithm: AlgorithmConfig = documented(
        help="RL algorithm (preset + overrides).", factory=AlgorithmConfig
    )
    learner: LearnerConfig = documented(help="Policy learner (FSDP2 ranks).", factory=LearnerConfig)
    critic: CriticConfig = documented(help="Value model.", factory=CriticConfig)
    eval: EvalConfig = documented(help="Held-out evaluation.", factory=EvalConfig)
    checkpoint: CheckpointConfig = documented(help="Checkpoints.", factory=CheckpointConfig)
    tracking: TrackingConfig = documented(help="Tracking.", factory=TrackingConfig)
    watchdog: WatchdogConfig = documented(
        help="Limits on the driver's waits.", factory=WatchdogConfig
    )

    @property
    def method(self) -> str:
        """What trains the policy, for run names, tags and comparisons: the RL algorithm's
        name, ``dpo``, or ``dpo+<algorithm>`` when RL follows DPO."""
        if not (self.dpo.enabled and self.dpo.steps > 0):
            return self.algorithm.name
        return f"dpo+{self.algorithm.name}" if self.learner.total_steps > 0 else "dpo"

    @property
    def run_dir(self) -> str:
        """``{fileroot}/{experiment}/{trial}``: every output of this run lives under it."""
        root = self.cluster.fileroot.rstrip("/")
        return f"{root}/{self.experiment.name}/{self.experiment.trial}"
