"""Reduce per-token losses ``[batch, tokens]`` to one scalar, micro-batch-safely.

Four modes (names as in verl's ``agg_loss``):

======================== =========================================== ==========================
mode                     loss                                        normaliser ``D``
======================== =========================================== ==========================
token-mean               Σ_i Σ_t m·l / D                             Σ_i Σ_t m  (tokens)
seq-mean-token-sum       Σ_i (Σ_t m·l) / D                           #sequences
seq-mean-token-mean      Σ_i (Σ_t m·l / Σ_t m) / D                   #sequences
seq-mean-token-sum-norm  Σ_i Σ_t m·l / D                             #sequences · C
======================== =========================================== ==========================

``#sequences`` counts rows with at least one response token (empty rows are padding). ``C`` is a
constant length (Dr.GRPO, arXiv 2503.20783, divides by the generation budget rather than by each
sequence's length); it defaults to the padded width ``tokens``.

Global normalisation contract
-----------------------------
Each loss is ``numerator(micro-batch) / D`` with a numerator that is a plain sum over rows. So:

1. once per optimiser step (a minibatch), compute ``D = global_normalizer(masks, mode)`` over
   *all* micro-batches of that minibatch; with data parallelism, all-reduce (SUM) the local ``D``
   of every rank — ``D`` is additive over micro-batches and ranks;
2. for each micro-batch call the loss with ``normalizer=D`` and ``backward()`` it (sum, do *not*
   average, the micro-batch losses);
3. the summed loss and the accumulated gradient then equal exactly (up to float rounding) those of
   the unsplit minibatch. If the data-parallel wrapper *averages* gradients over ``R`` ranks (DDP
   default), pass ``normalizer=D / R`` (or multiply each loss by ``R``).

Any mask-dependent quantity that must not change ``D`` (e.g. behaviour-masked tokens in the
decoupled loss) only zeroes its numerator terms: ``D`` depends on ``loss_mask`` alone.
"""

from collections.abc import Sequence

import torch

from core.algorithms.masking import as_bool, nonempty_rows

Tensor = torch.Tensor

AGGREGATION_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATION_MODES}")


def global_normalizer(
    loss_masks: Tensor | Sequence[Tensor],
    mode: str,
    *,
    norm_constant: float | None = None,
) -> float:
    """Denominator ``D`` of ``aggregate_loss`` for the union of one or more masks.

    Args:
        loss_masks: one ``[batch, tokens]`` mask, or a list of micro-batch masks (widths may
            differ, except for ``seq-mean-token-sum-norm`` without ``norm_constant``).
        mode: an aggregation mode (see module docstring).
        norm_constant: ``C`` for ``seq-mean-token-sum-norm``; default the padded width.

    Returns:
        ``D`` as a Python float (exact for counts below 2**53). Additive: the ``D`` of a union is
        the sum of the parts' ``D`` (so all-reduce SUM over data-parallel ranks).
    """
    _check_mode(mode)
    masks = [loss_masks] if isinstance(loss_masks, Tensor) else list(loss_masks)
    if mode == "token-mean":
        return float(sum(int(as_bool(m).sum()) for m in masks))
    n_seqs = float(sum(int(nonempty_rows(m).sum()) for m in masks))
    if mode != "seq-mean-token-sum-norm":
        return n_seqs
    if norm_constant is None:
        widths = {m.shape[-1] for m in masks}
        if len(widths) != 1:
            raise ValueError(
                "seq-mean-token-sum-norm over masks of different widths needs norm_constant"
            )
        norm_constant = float(widths.pop())
    return n_seqs * float(norm_constant)


def aggregate_loss(
    token_losses: Tensor,
    loss_mask: Tensor,
    mode: str = "token-mean",
    *,
    normalizer: float | Tensor | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Reduce ``token_losses`` ``[batch, tokens]`` to a scalar (see the module docstring).

    Args:
        token_losses: ``[batch, tokens]`` per-token losses (anything at masked-out positions,
            even nan, is ignored).
        loss_mask: ``[batch, tokens]`` 0/1 float or bool, 1 on response tokens.
        mode: ``token-mean`` | ``seq-mean-token-sum`` | ``seq-mean-token-mean`` |
            ``seq-mean-token-sum-norm`` (Dr.GRPO, arXiv 2503.20783).
        normalizer: global ``D`` from ``global_normalizer`` over all micro-batches/ranks; default
            the local ``D`` of ``loss_mask`` (i.e. the plain per-batch mean).
        norm_constant: ``C`` for ``seq-mean-token-sum-norm`` when ``normalizer`` is None.

    Returns:
        0-dim loss ``numerator / D`` (0 when ``D`` is 0).
    """
    _check_mode(mode)
    mask = as_bool(loss_mask)
    kept = torch.where(mask, token_losses, torch.zeros_like(token_losses))
    if mode == "seq-mean-token-mean":
        numerator = (kept.sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    else:
        numerator = kept.sum()
    if normalizer is None:
        normalizer = global_normalizer(mask, mode, norm_constant=norm_constant)
    if isinstance(normalizer, Tensor):
        return numerator / normalizer.clamp(min=1e-8)
    return numerator / max(float(normalizer), 1e-8)
