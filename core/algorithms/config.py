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
from core.algorithms.policy_loss import BEHAVIOUR_LEVELS, BEHAVIOUR_MASK_MODES, IMPORTANCE_LEVELS
from core.schema import documented


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
    group_size: int = documented(8, "Responses sampled per prompt (a group).")
    normalize_std: bool = documented(True, "GRPO: divide by the group std (False = Dr.GRPO).")
    gamma: float = documented(1.0, "Discount (GAE, REINFORCE++).")
    lam: float = documented(1.0, "GAE lambda.")

    # --- Reward shaping ---------------------------------------------------------------------
    reward_bias: float = documented(0.0, "Added to rewards first.")
    reward_scale: float = documented(1.0, "Multiplies (reward + bias).")
    reward_clip: float | None = documented(None, "Clip shaped rewards to [-c, c]; None = off.")
    overlong_reward_penalty: bool = documented(False, "DAPO soft overlong punishment on/off.")
    overlong_buffer_len: int = documented(4096, "DAPO L_cache: length of the soft-penalty zone.")
    overlong_penalty_factor: float = documented(1.0, "Penalty at (and beyond) the maximum length.")
    overlong_max_len: int | None = documented(
        None, "DAPO L_max; None = the rollout's max_new_tokens."
    )
    kl_in_reward_coef: float = documented(0.0, "beta of the KL-to-reference penalty in the reward.")

    # --- Sampling (temperature lives in rollout.temperature; the learner scales the same) -----
    dynamic_sampling: bool = documented(False, "DAPO: drop groups whose rewards are all equal.")

    # --- Policy loss ------------------------------------------------------------------------
    eps_clip: float = documented(0.2, "PPO clip range (low side).")
    eps_clip_high: float | None = documented(None, "Upper clip range; None = eps_clip (symmetric).")
    dual_clip: float | None = documented(None, "Dual-clip constant c > 1; None = off.")
    importance_level: str = documented(
        "token", f"Ratio level, one of {IMPORTANCE_LEVELS} (sequence = GSPO)."
    )
    loss_aggregation: str = documented(
        "token-mean", f"Loss aggregation, one of {AGGREGATION_MODES}."
    )
    loss_norm_constant: float | None = documented(
        None,
        "Constant length C of seq-mean-token-sum-norm; None = the generation budget "
        "(rollout.max_new_tokens) in an experiment config.",
    )
    ppo_n_minibatches: int = documented(4, "Optimiser steps per training batch.")

    # --- Asynchronous (decoupled) PPO -------------------------------------------------------
    decoupled: bool = documented(
        True, "Decoupled PPO: clip against proximal logprobs, weight by prox/behav."
    )
    behaviour_cap: float | None = documented(
        5.0,
        "Upper bound on the behaviour (rollout-correction) weight prox/behav; None = off.",
    )
    behaviour_mask_mode: str = documented(
        "mask",
        f"Outside the bounds: {BEHAVIOUR_MASK_MODES} (cap = truncated IS, mask = masked IS).",
    )
    behaviour_level: str = documented(
        "token",
        f"Behaviour weight level, one of {BEHAVIOUR_LEVELS}: per token, the row's product, or "
        "the row's geometric mean.",
    )
    behaviour_cap_low: float | None = documented(
        None, "Masked IS only: weights below this are dropped too; None = no lower bound."
    )
    behaviour_veto: float | None = documented(
        None, "Drop a whole row if any token's own weight is below this; None = off."
    )
    use_loglinear_proximal: bool = documented(
        False, "Approximate proximal logprobs log-linearly instead of recomputing."
    )

    # --- KL / entropy regularisation --------------------------------------------------------
    kl_coef: float = documented(0.0, "KL-to-reference loss coefficient.")
    kl_estimator: str = documented("k3", f"KL estimator, one of {KL_ESTIMATORS}.")
    entropy_coef: float = documented(0.0, "Entropy bonus coefficient.")

    # --- Critic -----------------------------------------------------------------------------
    use_critic: bool = documented(False, "Train a value model (GAE).")
    value_clip: float | None = documented(0.5, "Value clip range; None = unclipped.")
    value_loss_coef: float = documented(0.5, "Weight of the value loss.")

    # --- Optimisation -----------------------------------------------------------------------
    lr: float = documented(1e-6, "Policy learning rate.")
    critic_lr: float = documented(1e-5, "Critic learning rate.")
    weight_decay: float = documented(0.01, "AdamW weight decay.")
    max_grad_norm: float = documented(1.0, "Gradient clipping norm.")

    def __post_init__(self) -> None:
        _validate(self)


def _choice(cfg: AlgorithmConfig, name: str, allowed: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in allowed:
        raise ValueError(f"{name}={getattr(cfg, name)!r} is not one of {allowed}")


def _at_least(cfg: AlgorithmConfig, name: str, low: float, *, strict: bool = False) -> None:
    value = getattr(cfg, name)
    if value is None:
        return
    if value < low or (strict and value == low):
        raise ValueError(f"{name}={value!r} must be {'>' if strict else '>='} {low}")


def _validate(cfg: AlgorithmConfig) -> None:
    """Raise ValueError naming the first offending field."""
    estimator = resolve_estimator(cfg.adv_estimator)
    _choice(cfg, "importance_level", IMPORTANCE_LEVELS)
    _choice(cfg, "behaviour_level", BEHAVIOUR_LEVELS)
    _choice(cfg, "behaviour_mask_mode", BEHAVIOUR_MASK_MODES)
    _choice(cfg, "loss_aggregation", AGGREGATION_MODES)
    _choice(cfg, "kl_estimator", KL_ESTIMATORS)
    for name in ("eps_clip", "eps_clip_high", "kl_coef", "kl_in_reward_coef", "weight_decay"):
        _at_least(cfg, name, 0.0)
    for name in ("value_loss_coef", "overlong_penalty_factor", "entropy_coef"):
        _at_least(cfg, name, 0.0)
    for name in ("group_size", "ppo_n_minibatches"):
        _at_least(cfg, name, 1)
    for name in ("reward_clip", "behaviour_cap", "value_clip", "loss_norm_constant"):
        _at_least(cfg, name, 0.0, strict=True)
    _at_least(cfg, "lr", 0.0)  # lr = 0: the mismatch canary (the policy must not move)
    for name in ("critic_lr", "max_grad_norm", "overlong_buffer_len"):
        _at_least(cfg, name, 0.0, strict=True)
    _at_least(cfg, "dual_clip", 1.0, strict=True)
    for name in ("behaviour_cap_low", "behaviour_veto"):
        _at_least(cfg, name, 0.0, strict=True)
    if cfg.behaviour_cap_low is not None:
        if cfg.behaviour_mask_mode != "mask":
            raise ValueError("behaviour_cap_low needs behaviour_mask_mode='mask' (masked IS)")
        if cfg.behaviour_cap is not None and cfg.behaviour_cap_low >= cfg.behaviour_cap:
            raise ValueError(
                f"behaviour_cap_low={cfg.behaviour_cap_low} must be below "
                f"behaviour_cap={cfg.behaviour_cap}"
            )
    if cfg.behaviour_veto is not None and cfg.behaviour_veto > 1.0:
        raise ValueError(f"behaviour_veto={cfg.behaviour_veto} must be in (0, 1]")
    for name in ("gamma", "lam"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{name}={getattr(cfg, name)!r} must be in [0, 1]")
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

PRESETS: dict[str, dict] = {
    "grpo": GRPO,
    "ppo": PPO,
    "dapo": DAPO,
    "dr_grpo": DR_GRPO,
    "rloo": RLOO,
    "reinforce_pp": REINFORCE_PP,
    "gspo": GSPO,
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
