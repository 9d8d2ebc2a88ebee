"""Clipped policy-gradient loss: PPO, its decoupled (asynchronous) form, dual clip, GSPO.

Three policies appear (AReaL, arXiv 2505.24298, §5):

* ``π_behav`` generated the tokens (an inference server, up to η versions stale);
* ``π_prox``  is the proximal policy the update is kept close to (the learner's weights at the
  start of this training step, recomputed or approximated by ``loglinear_proximal_logprobs``);
* ``π_θ``     is being optimised.

Decoupled PPO objective, per token (a minimisation)::

    r   = π_θ / π_prox                                  clip ratio (gradient flows)
    w   = sg[π_prox / π_behav]                          behaviour importance weight
    ℓ   = w · max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high))

With ``behaviour_logprobs=None`` (w = 1) this is plain PPO (arXiv 1707.06347) with
``π_old = π_prox``; with ``π_behav = π_prox`` the two coincide.

CISPO (MiniMax-M1, arXiv 2506.13585 §3.1) clips the importance weight instead of the update::

    ∇ℓ  = -sg[clip(r, 1-ε_low, 1+ε_high) · w] · A · ∇log π_θ

so a token outside the trust region still contributes its (bounded) gradient, where PPO's clip
drops it when the advantage pushes the ratio further out; at ``r = 1`` the two are equal.
"""

import math
from typing import Any

import torch

from core.algorithms.aggregation import aggregate_loss
from core.algorithms.kl import kl_penalty
from core.algorithms.masking import as_bool, masked_max, masked_mean, masked_min

Tensor = torch.Tensor

IMPORTANCE_LEVELS = ("token", "sequence")
BEHAVIOUR_LEVELS = ("token", "sequence", "geometric")
BEHAVIOUR_MASK_MODES = ("cap", "mask")
# log-weights are clamped to ±this before exp (a sequence-level product can be huge; verl
# bounds its rollout-correction log-ratio the same way)
LOG_WEIGHT_BOUND = 20.0


def _seq_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``[batch, tokens]`` -> ``[batch, 1]`` mean over each row's response tokens."""
    return masked_mean(values, mask, dim=-1).unsqueeze(-1)


def behaviour_weights(
    proximal_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    cap: float | None = None,
    mask_mode: str = "cap",
    level: str = "token",
    cap_low: float | None = None,
    veto: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Behaviour importance weights ``w = π_prox / π_behav`` (no gradient), truncated or masked:
    the rollout correction of decoupled PPO (AReaL, arXiv 2505.24298) and of train/inference
    mismatch (truncated IS, Yao et al. 2025 "Your efficient RL framework secretly brings you
    off-policy RL training"; masked IS, as verl's rollout correction and slime's MIS).

    ``level``: ``"token"`` one weight per token; ``"sequence"`` each token of a row gets the
    row's product ``exp(Σ_t log w_t)`` (the exact sequence-level ratio); ``"geometric"`` the
    row's geometric mean ``exp(mean_t log w_t)`` (length-normalised, as GSPO). Log-weights are
    clamped to ``±LOG_WEIGHT_BOUND`` before ``exp``.

    ``mask_mode="cap"`` (truncated IS, TIS): weights above ``cap`` become ``cap``.
    ``mask_mode="mask"`` (masked IS, MIS): weights above ``cap`` or below ``cap_low`` become 0,
    dropping the token (or the whole row, at sequence/geometric level) from the loss numerator;
    the normaliser is unchanged (AReaL's ``behav_imp_weight_cap``). ``veto``: a row with any
    token whose own weight is below it is dropped whole, at any level (verl's token veto: one
    token the behaviour policy found far likelier than the learner does marks a broken sample).

    Returns:
        ``(weights, raw_weights, excluded)``, all ``[batch, tokens]``; ``excluded`` is the bool
        set of response tokens outside the bounds (truncated in cap mode, zeroed in mask mode)
        or vetoed.
    """
    if mask_mode not in BEHAVIOUR_MASK_MODES:
        raise ValueError(
            f"unknown behaviour_mask_mode {mask_mode!r}; expected {BEHAVIOUR_MASK_MODES}"
        )
    if level not in BEHAVIOUR_LEVELS:
        raise ValueError(f"unknown behaviour_level {level!r}; expected {BEHAVIOUR_LEVELS}")
    if cap_low is not None and mask_mode != "mask":
        raise ValueError("behaviour_cap_low bounds masked IS only (behaviour_mask_mode='mask')")
    mask = as_bool(loss_mask)
    token_log_w = torch.where(mask, (proximal_logprobs - behaviour_logprobs).detach(), 0.0)
    log_w = token_log_w
    if level == "sequence":
        log_w = token_log_w.sum(dim=-1, keepdim=True).expand_as(token_log_w)
    elif level == "geometric":
        log_w = _seq_mean(token_log_w, mask).expand_as(token_log_w)
    raw = torch.where(mask, log_w.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND).exp(), 0.0)
    high = mask & (raw > cap) if cap is not None else torch.zeros_like(mask)
    low = mask & (raw < cap_low) if cap_low is not None else torch.zeros_like(mask)
    vetoed = torch.zeros_like(mask)
    if veto is not None:
        below = (mask & (token_log_w < math.log(veto))).any(dim=-1, keepdim=True)
        vetoed = mask & below
    if mask_mode == "cap":
        weights = raw.clamp(max=cap) if cap is not None else raw
        weights = torch.where(vetoed, 0.0, weights)
    else:
        weights = torch.where(high | low | vetoed, 0.0, raw)
    return weights, raw, high | low | vetoed


def effective_sample_size(weights: Tensor, mask: Tensor) -> Tensor:
    """Normalised effective sample size ``(Σw)² / (n·Σw²)`` of the weights over the response
    tokens (Kong 1992): 1 when every weight is equal, → 1/n when one weight dominates."""
    m = as_bool(mask)
    w = torch.where(m, weights, 0.0)
    n = m.sum()
    denominator = n * (w**2).sum()
    return torch.where(denominator > 0, w.sum() ** 2 / denominator.clamp(min=1e-30), 1.0)


def ppo_policy_loss(
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    behaviour_logprobs: Tensor | None = None,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    dual_clip: float | None = None,
    importance_level: str = "token",
    behaviour_cap: float | None = None,
    behaviour_mask_mode: str = "cap",
    behaviour_level: str = "token",
    behaviour_cap_low: float | None = None,
    behaviour_veto: float | None = None,
    aggregation: str = "token-mean",
    normalizer: float | Tensor | None = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(Decoupled) clipped PPO policy loss; see the module docstring for the objective.

    Args:
        logprobs: ``[batch, tokens]`` log π_θ of the sampled tokens (the only input with grad).
        proximal_logprobs: ``[batch, tokens]`` log π_prox (π_old of plain PPO); detached.
        advantages: ``[batch, tokens]`` (``broadcast_to_tokens`` for sequence advantages).
        loss_mask: ``[batch, tokens]`` 0/1, 1 on response tokens.
        behaviour_logprobs: ``[batch, tokens]`` log π_behav; None = plain PPO.
        eps_clip: lower clip range ε_low (and ε_high when ``eps_clip_high`` is None).
        eps_clip_high: upper clip range ε_high ("clip-higher", DAPO arXiv 2503.14476).
        dual_clip: constant ``c > 1`` of dual-clip PPO (Ye et al., arXiv 1912.09729): for
            ``A < 0`` the token loss is ``min(ℓ, c·|A|)``; None = off.
        importance_level: ``"token"``, or ``"sequence"`` (GSPO, arXiv 2507.18071): the ratio of
            every token of a row is ``s = exp(mean_t log(π_θ/π_prox))`` in value, with GSPO-token
            gradient ``s · ∇log π_θ(y_t)`` (``sg[s] · π_θ(y_t) / sg[π_θ(y_t)]``).
        behaviour_cap, behaviour_mask_mode, behaviour_level, behaviour_cap_low, behaviour_veto:
            ``cap``, ``mask_mode``, ``level``, ``cap_low``, ``veto`` of ``behaviour_weights``.
        aggregation, normalizer, norm_constant: see ``aggregate_loss`` (pass the global
            ``normalizer`` when the batch is split into micro-batches).

    Returns:
        ``(loss, stats)``: 0-dim loss; detached 0-dim stats over this call's response tokens:
        ``clip_frac``, ``dual_clip_frac``, ``approx_kl`` (k3 estimate of KL(π_prox‖π_θ)),
        ``approx_kl_k2`` (½(Δ log p)²), ``ratio_mean/max/min``, ``behav_weight_mean/max/min``
        (raw, before truncation or masking; 1 without behaviour log-probs), ``behav_ess`` (their
        normalised effective sample size), ``behav_masked_frac`` (fraction outside the bounds:
        dropped in ``"mask"`` mode, truncated in ``"cap"`` mode, or vetoed).
    """
    if importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(
            f"unknown importance_level {importance_level!r}; expected {IMPORTANCE_LEVELS}"
        )
    if eps_clip < 0 or (eps_clip_high is not None and eps_clip_high < 0):
        raise ValueError("eps_clip and eps_clip_high must be >= 0")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    mask = as_bool(loss_mask)
    proximal_logprobs = proximal_logprobs.detach()
    advantages = torch.where(mask, advantages.detach(), 0.0)

    # Clip ratio r = π_θ / π_prox (padding forced to log-ratio 0 so it never produces inf/nan).
    log_ratio = torch.where(mask, logprobs - proximal_logprobs, 0.0)
    if importance_level == "sequence":
        seq_log_ratio = _seq_mean(log_ratio, mask).detach()
        log_ratio = torch.where(mask, seq_log_ratio + logprobs - logprobs.detach(), 0.0)
    ratio = log_ratio.exp()

    # Pessimistic (clipped) surrogate, as a loss.
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    clipped_ratio = ratio.clamp(1.0 - eps_clip, 1.0 + eps_high)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * clipped_ratio
    token_loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = mask & (loss_clipped > loss_unclipped)

    # Dual clip: bound the loss of negative-advantage tokens by c·|A|.
    dual_clipped = torch.zeros_like(mask)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_clipped = mask & (advantages < 0) & (token_loss > bound)
        token_loss = torch.where(dual_clipped, bound, token_loss)

    # Behaviour importance weight π_prox / π_behav (decoupled PPO).
    weights, raw_weights, exceeded = _behaviour(
        proximal_logprobs,
        behaviour_logprobs,
        mask,
        behaviour_cap=behaviour_cap,
        behaviour_mask_mode=behaviour_mask_mode,
        behaviour_level=behaviour_level,
        behaviour_cap_low=behaviour_cap_low,
        behaviour_veto=behaviour_veto,
    )
    token_loss = token_loss * weights

    loss = aggregate_loss(
        token_loss, mask, aggregation, normalizer=normalizer, norm_constant=norm_constant
    )
    stats = _stats(logprobs, proximal_logprobs, ratio, raw_weights, exceeded, mask)
    stats["clip_frac"] = masked_mean(clipped.float(), mask).detach()
    stats["dual_clip_frac"] = masked_mean(dual_clipped.float(), mask).detach()
    return loss, stats


def cispo_policy_loss(
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    behaviour_logprobs: Tensor | None = None,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    aggregation: str = "token-mean",
    normalizer: float | Tensor | None = None,
    norm_constant: float | None = None,
    **behaviour: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO policy loss (MiniMax-M1, arXiv 2506.13585 eq. 4): REINFORCE on ``log π_θ`` weighted
    by the clipped, detached ratio ``clip(π_θ/π_prox, 1-ε_low, 1+ε_high)`` and the behaviour
    weight of decoupled PPO. No token is dropped for its ratio (only the behaviour weights' mask
    and veto drop any); the paper bounds only the high side (``eps_clip >= 1`` leaves the low
    side open). The loss value is ``-c·A`` per token (PPO's scale), its gradient
    ``-c·A·∇log π_θ``. With one optimiser step per update π_prox is the training pass itself, so
    the ratio is 1 and CISPO takes PPO's step: the clip acts from a second minibatch on.

    Arguments as :func:`ppo_policy_loss` (``behaviour_cap``, ``behaviour_mask_mode``,
    ``behaviour_level``, ``behaviour_cap_low`` and ``behaviour_veto`` among ``behaviour``).
    Returns ``(loss, stats)`` with the same keys; ``clip_frac`` is the share of tokens whose
    ratio was truncated (either side, whatever the advantage's sign), ``dual_clip_frac`` is 0.
    """
    if eps_clip < 0 or (eps_clip_high is not None and eps_clip_high < 0):
        raise ValueError("eps_clip and eps_clip_high must be >= 0")
    mask = as_bool(loss_mask)
    proximal_logprobs = proximal_logprobs.detach()
    advantages = torch.where(mask, advantages.detach(), 0.0)
    ratio = torch.where(mask, logprobs.detach() - proximal_logprobs, 0.0).exp()
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    low, high = max(0.0, 1.0 - eps_clip), 1.0 + eps_high
    truncated = mask & ((ratio < low) | (ratio > high))
    weights, raw_weights, exceeded = _behaviour(
        proximal_logprobs, behaviour_logprobs, mask, **behaviour
    )
    coefficient = (ratio.clamp(low, high) * weights).detach()
    # exp(log π_θ - sg[log π_θ]) is 1 in value with gradient ∇log π_θ: the gradient of
    # ``-c·A·log π_θ``, with a loss value on PPO's scale (-c·A against PPO's -A·r).
    unit = torch.where(mask, logprobs - logprobs.detach(), 0.0).exp()
    token_loss = torch.where(mask, -coefficient * advantages * unit, 0.0)
    loss = aggregate_loss(
        token_loss, mask, aggregation, normalizer=normalizer, norm_constant=norm_constant
    )
    stats = _stats(logprobs, proximal_logprobs, ratio, raw_weights, exceeded, mask)
    stats["clip_frac"] = masked_mean(truncated.float(), mask).detach()
    stats["dual_clip_frac"] = torch.zeros_like(stats["clip_frac"])
    return loss, stats


def _behaviour(
    proximal_logprobs: Tensor,
    behaviour_logprobs: Tensor | None,
    mask: Tensor,
    *,
    behaviour_cap: float | None = None,
    behaviour_mask_mode: str = "cap",
    behaviour_level: str = "token",
    behaviour_cap_low: float | None = None,
    behaviour_veto: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``behaviour_weights`` from a loss's keyword arguments; all ones without π_behav."""
    if behaviour_logprobs is None:
        ones = torch.where(mask, 1.0, 0.0).to(proximal_logprobs.dtype)
        return ones, ones, torch.zeros_like(mask)
    return behaviour_weights(
        proximal_logprobs,
        behaviour_logprobs,
        mask,
        cap=behaviour_cap,
        mask_mode=behaviour_mask_mode,
        level=behaviour_level,
        cap_low=behaviour_cap_low,
        veto=behaviour_veto,
    )


@torch.no_grad()
def _stats(
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    ratio: Tensor,
    raw_weights: Tensor,
    exceeded: Tensor,
    mask: Tensor,
) -> dict[str, Tensor]:
    """The statistics every policy loss reports, over the response tokens (detached)."""
    token_log_ratio = torch.where(mask, logprobs - proximal_logprobs, 0.0)
    stats = {
        "approx_kl": masked_mean(kl_penalty(proximal_logprobs, logprobs, "k3"), mask),
        "approx_kl_k2": masked_mean(0.5 * token_log_ratio**2, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": masked_max(ratio, mask),
        "ratio_min": masked_min(ratio, mask),
        "behav_weight_mean": masked_mean(raw_weights, mask),
        "behav_weight_max": masked_max(raw_weights, mask),
        "behav_weight_min": masked_min(raw_weights, mask),
        "behav_ess": effective_sample_size(raw_weights, mask),
        "behav_masked_frac": masked_mean(exceeded.float(), mask),
    }
    return {k: v.detach() for k, v in stats.items()}


def loglinear_alpha(
    versions: Tensor,
    current_version: float,
    *,
    proximal_version: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Per-token interpolation weight α of ``loglinear_proximal_logprobs`` (AReaL's formula).

    With ``v_b = versions`` (the weight version that generated each token; < 0 for tokens not
    generated, e.g. prompt), ``v_θ = current_version`` (the version the update being computed
    produces: the learner's version + 1) and ``v_prox = proximal_version`` (default ``v_θ - 1``:
    the learner's weights at the start of the update)::

        α = clamp((v_prox - v_b) / (v_θ - v_b), 0, 1)   if 0 <= v_b < v_θ
        α = 0                                           otherwise (not generated)

    A token generated by the proximal weights themselves (``v_b = v_prox``, on-policy) gets
    α = 0, so π_prox = π_behav there and the clip ratio π_θ / π_behav keeps clipping in every
    minibatch of the update, as recomputing π_prox would.

    Returns:
        ``[batch, tokens]`` α of ``dtype``.
    """
    v_theta = float(current_version)
    v_prox = v_theta - 1.0 if proximal_version is None else float(proximal_version)
    v_b = versions.to(torch.float64)
    generated = (v_b >= 0) & (v_b < v_theta)
    gap = torch.where(generated, v_theta - v_b, 1.0)
    alpha = torch.where(generated, ((v_prox - v_b) / gap).clamp(0.0, 1.0), 0.0)
    return alpha.to(dtype)


def loglinear_proximal_logprobs(
    behaviour_logprobs: Tensor,
    current_logprobs: Tensor,
    versions: Tensor,
    current_version: float,
    *,
    proximal_version: float | None = None,
) -> Tensor:
    """Approximate log π_prox without a forward pass (AReaL's ``prox_logp_method="loglinear"``).

    Assumes each token's log-prob moves linearly in the version number between the version that
    generated it and the current one::

        log π_prox ≈ log π_behav + α · (log π_θ - log π_behav),   α from ``loglinear_alpha``

    ``current_logprobs`` is detached (π_prox is a constant of the loss). Tokens from the
    proximal version itself get α = 0 (π_prox = π_behav exactly); very stale tokens get α → 1
    (π_prox ≈ π_θ).

    Args:
        behaviour_logprobs: ``[batch, tokens]`` log π_behav (from the rollout).
        current_logprobs: ``[batch, tokens]`` log π_θ from the training forward pass.
        versions: ``[batch, tokens]`` int, generating version per token (< 0 = not generated).
        current_version: ``v_θ``, the version the update produces (learner version + 1).
        proximal_version: ``v_prox``; default ``current_version - 1``.
    Returns:
        ``[batch, tokens]`` approximate proximal log-probs (no gradient).
    """
    behav = behaviour_logprobs.detach()
    alpha = loglinear_alpha(
        versions, current_version, proximal_version=proximal_version, dtype=behav.dtype
    )
    return behav + alpha * (current_logprobs.detach() - behav)
