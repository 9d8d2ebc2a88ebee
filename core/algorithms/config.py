"""Algorithm configuration and named presets.

``AlgorithmConfig`` holds every knob of the loss/advantage functions in this package. It is an
OmegaConf structured config (fields are str/int/float/bool/list or ``X | None``; choices are
plain strings checked in ``__post_init__``). Presets are plain dicts of field overrides::

    cfg = algorithm_config("dapo", group_size=8)
"""

from dataclasses import dataclass, fields

from core.algorithms.aggregation import AGGREGATION_MODES
from core.algorithms.estimators import ESTIMATORS, resolve_estimator
from core.algorithms.kl import KL_ESTIMATORS
from core.algorithms.objectives import OBJECTIVES, resolve_objective
from core.algorithms.policy_loss import BEHAVIOUR_LEVELS, BEHAVIOUR_MASK_MODES, IMPORTANCE_LEVELS
from core.schema import bound_problems, documented


@dataclass
class AlgorithmConfig:
    """All algorithm knobs; see ``PRESETS`` for named recipes and docs/algorithms.md."""

    # --- Identity ---------------------------------------------------------------------------
    name: str = documented("custom", "Preset this config came from.")

    # --- Advantage estimation ---------------------------------------------------------------
    adv_estimator: str = documented(
        "grpo",
        f"Advantage estimator, one of {tuple(ESTIMATORS)}, or a 'module:function' path to one "
        "registered with @advantage_estimator (core/algorithms/estimators.py).",
    )
    group_size: int = documented(8, "Responses sampled per prompt (a group).", ge=1)
    normalize_std: bool = documented(True, "GRPO: divide by the group std (False = Dr.GRPO).")
    gamma: float = documented(1.0, "Discount (GAE, REINFORCE++).", ge=0, le=1)
    lam: float = documented(1.0, "GAE lambda.", ge=0, le=1)

    # --- Reward shaping ---------------------------------------------------------------------
    reward_bias: float = documented(0.0, "Added to rewards first.")
    reward_scale: float = documented(1.0, "Multiplies (reward + bias).")
    reward_clip: float | None = documented(
        None, "Clip shaped rewards to [-c, c]; None = off.", gt=0
    )
    overlong_reward_penalty: bool = documented(False, "DAPO soft overlong punishment on/off.")
    overlong_buffer_len: int = documented(
        4096, "DAPO L_cache: length of the soft-penalty zone.", gt=0
    )
    overlong_penalty_factor: float = documented(
        1.0, "Penalty at (and beyond) the maximum length.", ge=0
    )
    overlong_max_len: int | None = documented(
        None, "DAPO L_max; None = the rollout's max_new_tokens."
    )
    kl_in_reward_coef: float = documented(
        0.0, "beta of the KL-to-reference penalty in the reward.", ge=0
    )

    # --- Sampling (temperature lives in sampling.temperature; the learner scales the same) -----
    dynamic_sampling: bool = documented(False, "DAPO: drop groups whose rewards are all equal.")

    # --- Policy loss ------------------------------------------------------------------------
    policy_loss: str = documented(
        "ppo",
        f"Policy loss, one of {tuple(OBJECTIVES)} (cispo: clipped importance weights, "
        "MiniMax-M1), or a 'module:function' path to one registered with @policy_objective "
        "(core/algorithms/objectives.py).",
    )
    eps_clip: float = documented(0.2, "PPO clip range (low side).", ge=0)
    eps_clip_high: float | None = documented(
        None, "Upper clip range; None = eps_clip (symmetric).", ge=0
    )
    dual_clip: float | None = documented(None, "Dual-clip constant c > 1; None = off.", gt=1)
    importance_level: str = documented(
        "token",
        f"Ratio level, one of {IMPORTANCE_LEVELS} (sequence = GSPO).",
        choices=IMPORTANCE_LEVELS,
    )
    loss_aggregation: str = documented(
        "token-mean", f"Loss aggregation, one of {AGGREGATION_MODES}.", choices=AGGREGATION_MODES
    )
    loss_norm_constant: float | None = documented(
        None,
        "Constant length C of seq-mean-token-sum-norm; None = the generation budget "
        "(sampling.max_new_tokens) in an experiment config.",
        gt=0,
    )
    ppo_n_minibatches: int = documented(4, "Optimiser steps per training batch.", ge=1)

    # --- Asynchronous (decoupled) PPO -------------------------------------------------------
    decoupled: bool = documented(
        True, "Decoupled PPO: clip against proximal logprobs, weight by prox/behav."
    )
    behaviour_cap: float | None = documented(
        5.0,
        "Upper bound on the behaviour (rollout-correction) weight prox/behav; None = off.",
        gt=0,
    )
    behaviour_mask_mode: str = documented(
        "mask",
        f"Outside the bounds: {BEHAVIOUR_MASK_MODES} (cap = truncated IS, mask = masked IS).",
        choices=BEHAVIOUR_MASK_MODES,
    )
    behaviour_level: str = documented(
        "token",
        f"Behaviour weight level, one of {BEHAVIOUR_LEVELS}: per token, the row's product, or "
        "the row's geometric mean.",
        choices=BEHAVIOUR_LEVELS,
    )
    behaviour_cap_low: float | None = documented(
        None, "Masked IS only: weights below this are dropped too; None = no lower bound.", gt=0
    )
    behaviour_veto: float | None = documented(
        None, "Drop a whole row if any token's own weight is below this; None = off.", gt=0, le=1
    )
    use_loglinear_proximal: bool = documented(
        False, "Approximate proximal logprobs log-linearly instead of recomputing."
    )

    # --- KL / entropy regularisation --------------------------------------------------------
    kl_coef: float = documented(0.0, "KL-to-reference loss coefficient.", ge=0)
    kl_estimator: str = documented(
        "k3", f"KL estimator, one of {KL_ESTIMATORS}.", choices=KL_ESTIMATORS
    )
    entropy_coef: float = documented(0.0, "Entropy bonus coefficient.", ge=0)

    # --- Critic -----------------------------------------------------------------------------
    use_critic: bool = documented(False, "Train a value model (GAE).")
    value_clip: float | None = documented(0.5, "Value clip range; None = unclipped.", gt=0)
    value_loss_coef: float = documented(0.5, "Weight of the value loss.", ge=0)

    # --- Optimisation -----------------------------------------------------------------------
    lr: float = documented(
        1e-6, "Policy learning rate (0: the mismatch canary, the policy must not move).", ge=0
    )
    critic_lr: float = documented(1e-5, "Critic learning rate.", gt=0)
    weight_decay: float = documented(0.01, "AdamW weight decay.", ge=0)
    max_grad_norm: float = documented(1.0, "Gradient clipping norm.", gt=0)

    def __post_init__(self) -> None:
        _validate(self)


def _validate(cfg: AlgorithmConfig) -> None:
    """Raise ValueError naming the first offending field."""
    for problem in bound_problems(cfg):  # the bounds and choices declared on the fields
        raise ValueError(problem)
    estimator = resolve_estimator(cfg.adv_estimator)
    objective = resolve_objective(cfg.policy_loss)
    for problem in objective.problems(cfg) if objective.problems else []:
        raise ValueError(problem)
    if cfg.behaviour_cap_low is not None:
        if cfg.behaviour_mask_mode != "mask":
            raise ValueError("behaviour_cap_low needs behaviour_mask_mode='mask' (masked IS)")
        if cfg.behaviour_cap is not None and cfg.behaviour_cap_low >= cfg.behaviour_cap:
            raise ValueError(
                f"behaviour_cap_low={cfg.behaviour_cap_low} must be below "
                f"behaviour_cap={cfg.behaviour_cap}"
            )
    if estimator.groups and cfg.group_size < 2:
        raise ValueError(f"group_size must be >= 2 for adv_estimator={cfg.adv_estimator!r}")
    if cfg.dynamic_sampling and cfg.group_size < 2:
        raise ValueError("group_size must be >= 2 for dynamic_sampling")
    if estimator.critic != cfg.use_critic:
        raise ValueError(
            f"use_critic={cfg.use_critic} does not fit adv_estimator={cfg.adv_estimator!r}: "
            f"{'it needs a critic' if estimator.critic else 'only a critic estimator (gae) uses one'}"
        )
    if cfg.kl_coef > 0 and cfg.kl_estimator == "k1":
        raise ValueError(
            "kl_estimator='k1' with kl_coef > 0: as a loss term k1's gradient is zero in "
            "expectation (no regularisation, only noise); use 'k3' or 'k2' for the KL loss, or "
            "k1 in the reward (kl_in_reward_coef)"
        )
    if cfg.use_loglinear_proximal and not cfg.decoupled:
        raise ValueError("use_loglinear_proximal=True requires decoupled=True")
    if cfg.overlong_max_len is not None and cfg.overlong_buffer_len > cfg.overlong_max_len:
        raise ValueError(
            f"overlong_buffer_len={cfg.overlong_buffer_len} exceeds "
            f"overlong_max_len={cfg.overlong_max_len}"
        )


# ---------------------------------------------------------------------------------------------
# Presets: plain dicts of field overrides on top of the AlgorithmConfig defaults (which already
# give decoupled PPO with a behaviour cap of 5 in mask mode, as AReaL's GRPO recipes do).
# ---------------------------------------------------------------------------------------------

# GRPO, DeepSeekMath arXiv 2402.03300. Values after verl examples/grpo_trainer (lr 1e-6,
# k3 KL loss 0.001, token-mean) with AReaL's decoupled loss (examples/math/gsm8k_grpo.yaml).
GRPO = dict(
    adv_estimator="grpo", group_size=8, normalize_std=True, eps_clip=0.2,
    loss_aggregation="token-mean", kl_coef=0.001, kl_estimator="k3", lr=1e-6,
)  # fmt: skip

# PPO with a critic and GAE, arXiv 1707.06347 / InstructGPT arXiv 2203.02155. Values after
# verl examples/ppo_trainer (gamma = lam = 1, value clip 0.5, critic lr 1e-5).
PPO = dict(
    adv_estimator="gae", use_critic=True, group_size=1, gamma=1.0, lam=1.0, eps_clip=0.2,
    value_clip=0.5, value_loss_coef=0.5, loss_aggregation="token-mean", kl_coef=0.0,
    lr=1e-6, critic_lr=1e-5,
)  # fmt: skip

# DAPO, arXiv 2503.14476. Values after verl recipe/dapo (clip-higher 0.2/0.28, 16 samples,
# overlong buffer 4096 of 20480, weight decay 0.1, no KL).
DAPO = dict(
    adv_estimator="grpo", group_size=16, normalize_std=True, eps_clip=0.2, eps_clip_high=0.28,
    dynamic_sampling=True, loss_aggregation="token-mean", overlong_reward_penalty=True,
    overlong_buffer_len=4096, overlong_penalty_factor=1.0, kl_coef=0.0, kl_in_reward_coef=0.0,
    lr=1e-6, weight_decay=0.1,
)  # fmt: skip

# Dr.GRPO, "Understanding R1-Zero-Like Training", arXiv 2503.20783 (sail-sg/understand-r1-zero,
# verl docs): no std normalisation, constant-length token-sum normalisation, no KL.
DR_GRPO = dict(
    adv_estimator="grpo", group_size=8, normalize_std=False,
    loss_aggregation="seq-mean-token-sum-norm", kl_coef=0.0, eps_clip=0.2, lr=1e-6,
)  # fmt: skip

# RLOO, Ahmadian et al. arXiv 2402.14740. Values after verl examples/rloo_trainer (k1 KL in the
# reward, coefficient 0.001).
RLOO = dict(
    adv_estimator="rloo", group_size=8, kl_in_reward_coef=0.001, kl_estimator="k1",
    kl_coef=0.0, loss_aggregation="token-mean", eps_clip=0.2, lr=1e-6,
)  # fmt: skip

# REINFORCE++, Hu et al. arXiv 2501.03262 (token-level KL in the reward, batch-whitened
# returns); coefficient after verl's kl_ctrl default 0.001.
REINFORCE_PP = dict(
    adv_estimator="reinforce_pp", group_size=8, gamma=1.0, kl_in_reward_coef=0.001,
    kl_estimator="k1", kl_coef=0.0, loss_aggregation="token-mean", eps_clip=0.2, lr=1e-6,
)  # fmt: skip

# GSPO, Qwen team arXiv 2507.18071: sequence-level ratio with clip range 3e-4 / 4e-4 (paper
# §5.1), sequence-mean loss, no KL (verl recipe/gspo).
GSPO = dict(
    adv_estimator="grpo", group_size=8, normalize_std=True, importance_level="sequence",
    behaviour_level="geometric", eps_clip=3e-4, eps_clip_high=4e-4,
    loss_aggregation="seq-mean-token-mean", kl_coef=0.0, lr=1e-6,
)  # fmt: skip

# CISPO, MiniMax-M1 arXiv 2506.13585 §3.1: GRPO's advantages, the ratio π_θ/π_prox clipped
# above only (the paper sets no lower bound, tuning ε_high alone: eps_clip 1 leaves the low side
# open; ε_high 0.28 as DAPO's clip-higher and Trinity-RFT's CISPO default), times the decoupled
# behaviour weight (masked above 5 as in every preset), token-mean, no KL.
CISPO = dict(
    adv_estimator="grpo", group_size=8, normalize_std=True, policy_loss="cispo", eps_clip=1.0,
    eps_clip_high=0.28, loss_aggregation="token-mean", kl_coef=0.0, lr=1e-6,
)  # fmt: skip

PRESETS: dict[str, dict] = {
    "grpo": GRPO,
    "ppo": PPO,
    "dapo": DAPO,
    "dr_grpo": DR_GRPO,
    "rloo": RLOO,
    "reinforce_pp": REINFORCE_PP,
    "gspo": GSPO,
    "cispo": CISPO,
}

PRESET_NOTES: dict[str, str] = {
    "grpo": "Group-normalised outcome advantages, clipped ratio, small k3 KL loss. "
    "Does NOT: train a critic, put KL in the reward, filter uniform groups.",
    "ppo": "Critic + GAE token advantages, clipped value loss. "
    "Does NOT: use groups (one sample per prompt), add any KL (set kl_in_reward_coef for "
    "InstructGPT-style RLHF).",
    "dapo": "GRPO + clip-higher, dynamic sampling, token-mean loss, soft overlong penalty. "
    "Does NOT: add any KL term, train a critic.",
    "dr_grpo": "GRPO without std normalisation and with a constant length normaliser (removes "
    "length and difficulty biases). Does NOT: add KL, normalise by group std or by length.",
    "rloo": "Leave-one-out baseline, k1 KL in the reward. "
    "Does NOT: normalise by std, add a KL loss term, train a critic.",
    "reinforce_pp": "Token returns with KL in the reward, whitened over the batch. "
    "Does NOT: use a group baseline (use adv_estimator='reinforce_pp_baseline'), a critic.",
    "gspo": "Sequence-level (length-normalised) importance ratio with tiny clip ranges. "
    "Does NOT: clip per token, add KL, train a critic.",
    "cispo": "REINFORCE weighted by the clipped, detached importance ratio: a token outside "
    "the clip range keeps a bounded gradient. Does NOT: drop clipped tokens as PPO does, add "
    "KL, train a critic.",
}


def preset_names() -> list[str]:
    """Names accepted by ``algorithm_config``."""
    return list(PRESETS)


def algorithm_config(name: str, **overrides: object) -> AlgorithmConfig:
    """Build the ``name`` preset, then apply ``overrides`` (validated together)."""
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; valid: {preset_names()}")
    known = {f.name for f in fields(AlgorithmConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown AlgorithmConfig field(s) {unknown}")
    return AlgorithmConfig(**{"name": name, **PRESETS[name], **overrides})
