"""The entmax (Fenchel-Young) losses of an output layer, computed from this package's normalizers.

For scores z over a vocabulary and the alpha-entmax p = entmax_alpha(z), the Fenchel-Young loss
of a target distribution q is

    L(z; q) = <p - q, z> + H_alpha(p)      gradient p - q,

with H_alpha the Tsallis entropy (Shannon's at alpha = 1, where L is the cross-entropy; Peters,
Niculae and Martins 2019; Blondel et al. 2020). q is the one-hot target, or with label smoothing
eps the target smoothed as fairseq's label_smoothed_cross_entropy smooths it: 1 - eps on the
target, eps / (V - 1) on each other entry. The loss is then the cross-entropy-like form, whose
minimum is H_alpha(q) and not 0 (the Fenchel-Young loss of q plus the constant H_alpha(q)): at
alpha = 1 it is exactly fairseq's label-smoothed cross-entropy, and its gradient is p - q at
every alpha. Peters and Martins (2021) smooth the entmax losses the same way.

Needs torch only. The loss itself (its autograd Function, which runs the normalizer once and keeps
only p for the backward, and the conjugate) is fairseq_entmax.entmax._fenchel_young, which the
drop-in for the entmax package's losses shares; this module adds the criterion's argument checks
and shapes.
"""

import functools
import math
import numbers
from typing import NamedTuple

import torch

from fairseq_entmax.entmax._fenchel_young import Regularizer, fenchel_young_rows, tsallis_conjugate
from fairseq_entmax.normalizers import alpha_entmax
from fairseq_entmax.normalizers._common import compute_dtype


class FenchelYoungLoss(NamedTuple):
    """What fenchel_young_loss returns, one value per row (rows of an ignored target hold 0).

    Attributes:
        loss: the loss with the (smoothed) target, differentiable w.r.t. the scores.
        unsmoothed: the loss with the one-hot target (equal to loss without smoothing); at
            alpha = 1, the negative log-likelihood of the target. Not differentiable.
        support: the number of entries of p that are nonzero (float). Not differentiable.
    """

    loss: torch.Tensor
    unsmoothed: torch.Tensor
    support: torch.Tensor


def check_loss_alpha(alpha):
    """Validate the alpha of an entmax loss.

    Args:
        alpha: a finite real number >= 1 (1 = cross-entropy, 1.5 = 1.5-entmax, 2 = sparsemax).

    Returns:
        alpha as a python float.

    Raises:
        ValueError: for anything else, saying what is allowed.
    """
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool) and math.isfinite(alpha) and alpha >= 1.0:
        return float(alpha)
    raise ValueError(
        f"the loss alpha must be a finite number >= 1 (1 = cross-entropy, 1.5 = 1.5-entmax, 2 = sparsemax), "
        f"got {alpha!r}"
    )


def tsallis_regularizer(alpha):
    """The Regularizer of alpha-entmax (Omega = -H_alpha) for the shared Fenchel-Young loss.

    Args:
        alpha: a float >= 1, as check_loss_alpha returns it.

    Returns:
        Regularizer(project, conjugate): this package's alpha_entmax (the exact maps at
        alpha = 1, 1.5 and 2) along the last dim, and its closed-form conjugate for the finite
        scores of an output layer.
    """
    return Regularizer(
        functools.partial(alpha_entmax, alpha=alpha, dim=-1),
        functools.partial(tsallis_conjugate, alpha=alpha, finite_scores=True),
    )


def fenchel_young_loss(logits, target, alpha, label_smoothing=0.0, ignore_index=None):
    """The entmax loss (Fenchel-Young loss of alpha-entmax) of each row of scores.

    p = alpha_entmax(logits, alpha) is computed once, by this package's normalizers (the exact
    maps at alpha = 1, 1.5 and 2); the loss comes from p without a second threshold search, and
    the backward is p - q from the saved p (no gradient through the normalizer): memory is p
    and the gradient, plus a few values per row.

    Args:
        logits: floating tensor (..., V) of finite scores (float16/bfloat16 are computed in
            float32: the loss comes back in float32, as fairseq's criteria compute it, and the
            gradient in logits' dtype).
        target: integer tensor (...) of target indices in [0, V), or ignore_index.
        alpha: a number >= 1: 1 is cross-entropy (softmax), 1.5 is 1.5-entmax, 2 is sparsemax,
            anything else alpha-entmax.
        label_smoothing: eps in [0, 1): the target is 1 - eps on the target index and
            eps / (V - 1) on every other, as in fairseq's label_smoothed_cross_entropy; the loss
            is then <p, z> + H_alpha(p) - <q, z>, whose gradient is p - q.
        ignore_index: rows whose target is this index get loss, support and gradient 0 (None:
            no row is ignored).

    Returns:
        FenchelYoungLoss(loss, unsmoothed, support), each of target's shape: the loss (with
        gradient), the loss against the one-hot target (the negative log-likelihood at
        alpha = 1) and the number of nonzero entries of p.

    Raises:
        ValueError: for an alpha or label_smoothing out of range, or shapes that do not match.
    """
    alpha = check_loss_alpha(alpha)
    if not (isinstance(label_smoothing, numbers.Real) and 0.0 <= label_smoothing < 1.0):
        raise ValueError(f"label_smoothing must be a number in [0, 1), got {label_smoothing!r}")
    if not (torch.is_tensor(logits) and logits.is_floating_point() and logits.dim() >= 1):
        raise ValueError("logits must be a floating point tensor of shape (..., V)")
    if not (torch.is_tensor(target) and not target.is_floating_point() and target.shape == logits.shape[:-1]):
        raise ValueError(
            f"target must be an integer tensor of shape {tuple(logits.shape[:-1])} (logits' shape without "
            f"the vocabulary dim), got {getattr(target, 'shape', type(target).__name__)}"
        )
    vocab = logits.shape[-1]
    if label_smoothing and vocab < 2:
        raise ValueError("label smoothing needs a vocabulary of at least 2 entries")
    rows = logits.reshape(-1, vocab)
    result = fenchel_young_rows(
        rows.to(compute_dtype(rows.dtype)),
        target.reshape(-1).long(),
        tsallis_regularizer(alpha),
        label_smoothing,
        ignore_index,
    )
    return FenchelYoungLoss(*(values.view(target.shape) for values in result))
