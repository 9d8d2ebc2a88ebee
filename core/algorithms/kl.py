"""Per-token KL estimators (J. Schulman, "Approximating KL Divergence", 2020,
http://joschu.net/blog/kl-approx.html).

Tokens are sampled from the policy ``p`` (log-probs ``logprobs``); ``q`` is the reference
(``ref_logprobs``). With ``log r = log q - log p``, each estimator's expectation under ``p``:

* ``k1 = -log r``               unbiased for KL(p‖q), high variance, can be negative;
* ``k2 = ½ (log r)²``           biased, low variance, ≥ 0 (its gradient is that of KL to 2nd order);
* ``k3 = (r - 1) - log r``      unbiased for KL(p‖q), low variance, ≥ 0 (verl's ``low_var_kl``).

As a *loss* term k1 regularises nothing: sampled from p, the gradient of ``log p - log q`` is
``∇log p``, whose expectation under p is zero — it adds only noise. It is fine as a reward
penalty (``kl_in_reward_coef``), where its value, not its gradient, is used; ``AlgorithmConfig``
refuses it as a loss. k3 is clamped as verl clamps it: ``log r`` to [-20, 20] before ``exp``
and the estimate to at most 10, so one token far from the reference cannot overflow the loss.
"""

import torch

Tensor = torch.Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")
K3_LOG_RATIO_BOUND = 20.0
K3_MAX = 10.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(π‖π_ref) from the sampled tokens' log-probs.

    Args:
        logprobs: ``[batch, tokens]`` log π(y_t) of the sampled tokens (gradient flows).
        ref_logprobs: ``[batch, tokens]`` log π_ref(y_t).
        kind: ``"k1"`` | ``"k2"`` | ``"k3"`` (see module docstring).
    Returns:
        ``[batch, tokens]`` estimates; mask/aggregate them with ``aggregate_loss``.
    """
    log_r = ref_logprobs - logprobs
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        # min 0 guards float rounding ((e^x - 1) - x >= 0 exactly); the bounds follow verl
        log_r = log_r.clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
        return (torch.expm1(log_r) - log_r).clamp(0.0, K3_MAX)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_ESTIMATORS}")
