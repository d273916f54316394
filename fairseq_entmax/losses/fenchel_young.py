"""The Fenchel-Young losses: one implementation, which the entmax_loss criterion
(fairseq_entmax.criterions.entmax_loss, through fenchel_young_loss) and the entmax drop-in's
losses (fairseq_entmax.entmax.losses, through fenchel_young_rows) both call.

For a regularized map p = argmax_p <p, z> - Omega(p) over the simplex, the Fenchel-Young loss of a
target distribution q is

    L(z; q) = Omega*(z) - <q, z> + Omega(q),      gradient p - q,

with Omega*(z) = <p, z> - Omega(p) the convex conjugate. The regularizers here are normalized so
that Omega is 0 at every one-hot q (Tsallis: Omega = -H_alpha, the negative Tsallis entropy, whose
map is alpha-entmax; the alpha-norm: Omega = ||p||_alpha - 1, whose map is normmax). The loss is
an autograd Function that runs the map once and keeps only p for the backward.

The output layer's loss (fenchel_young_loss): for scores z over a vocabulary and the alpha-entmax
p = entmax_alpha(z), the loss of a target q is <p - q, z> + H_alpha(p), gradient p - q (Shannon's
entropy at alpha = 1, where L is the cross-entropy; Peters, Niculae and Martins 2019; Blondel et
al. 2020). q is the one-hot target, or with label smoothing eps the target smoothed as fairseq's
label_smoothed_cross_entropy smooths it: 1 - eps on the target, eps / (V - 1) on each other entry.
The loss is then the cross-entropy-like form, whose minimum is H_alpha(q) and not 0 (the Omega(q)
term left out, as fairseq's label-smoothed cross-entropy leaves out the target's entropy): at
alpha = 1 it is exactly fairseq's label-smoothed cross-entropy, and its gradient is p - q at every
alpha. Peters and Martins (2021) smooth the entmax losses the same way.

Needs torch only.
"""

import functools
import math
import numbers
from collections.abc import Callable
from typing import NamedTuple

import torch

from fairseq_entmax.normalizers import alpha_entmax
from fairseq_entmax.normalizers._common import compute_dtype, uses_sync_free_path


class Regularizer(NamedTuple):
    """A regularized map and its convex conjugate.

    Attributes:
        project: scores (N, V) -> p (N, V), the map along the last dim.
        conjugate: (p, z) -> Omega*(z) per row (N,), from the map's p = project(z).
    """

    project: Callable
    conjugate: Callable


def score_dot(p, z, finite_scores=False):
    """<p, z> per row of (N, V) tensors, as an (N, 1) tensor.

    Args:
        p: (N, V) probabilities of the scores z.
        z: (N, V) scores.
        finite_scores: the caller guarantees that z holds no -inf. Otherwise a -inf score
            (which has p = 0) adds 0, where the plain product would give 0 * -inf = NaN.

    Returns:
        (N, 1) values; NaN on a row with a NaN score (whose p is NaN).
    """
    # A batched dot product: no temporary of the scores' size on the common path.
    pz = torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).view(-1, 1)
    if finite_scores:
        return pz
    if uses_sync_free_path(pz):
        # No row can be picked without reading values back: every row is summed again.
        masked = (p * z.masked_fill(p == 0, 0.0)).sum(dim=-1, keepdim=True)
        return torch.where(torch.isnan(pz), masked, pz)
    # The rows that hold a -inf score (few, if any) are summed again without it.
    bad = torch.isnan(pz).squeeze(1)
    if bool(bad.any()):
        p_bad, z_bad = p[bad], z[bad]
        pz[bad] = (p_bad * z_bad.masked_fill(p_bad == 0, 0.0)).sum(dim=-1, keepdim=True)
    return pz


def tsallis_conjugate(p, z, alpha, finite_scores=False):
    """Omega*(z) = <p, z> + H_alpha(p) per row, for the Tsallis entropy H_alpha and its map
    p = alpha-entmax(z), without a pass over p's powers.

    On the support, p_i^(alpha - 1) = (alpha - 1) z_i - tau, so sum p^alpha = (alpha - 1) <p, z> -
    tau, and tau follows from the largest score, whose p is at least 1 / V and so well
    conditioned: tau = (alpha - 1) z_max - p_max^(alpha - 1). This holds for every alpha > 0
    (below 1 every p_i is positive). At alpha = 1 (the limit) it is log-sum-exp(z) =
    z_max - log p_max.

    Args:
        p: (N, V) probabilities, the alpha-entmax of z.
        z: (N, V) scores.
        alpha: a float > 0, or an (N, 1) tensor of them (one per row).
        finite_scores: z holds no -inf (see score_dot).

    Returns:
        (N,) values.
    """
    z_max, argmax = z.max(dim=-1, keepdim=True)
    log_p_max = p.gather(-1, argmax).log_()
    if not torch.is_tensor(alpha) and alpha == 1.0:
        return (z_max - log_p_max).squeeze(-1)
    pz = score_dot(p, z, finite_scores)
    am1 = alpha - 1.0
    # (1 - p_max^(alpha - 1)) / (alpha (alpha - 1)) without cancellation as alpha -> 1
    tail = torch.expm1(log_p_max * am1).div_(-alpha * am1)
    value = pz * (am1 / alpha) + z_max / alpha + tail
    if torch.is_tensor(alpha):
        value = torch.where(am1 == 0, z_max - log_p_max, value)
    return value.squeeze(-1)


def norm_conjugate(p, z, alpha):
    """Omega*(z) = <p, z> - ||p||_alpha + 1 per row, for Omega(p) = ||p||_alpha - 1 (normmax).

    Args:
        p: (N, V) probabilities, the alpha-normmax of z.
        z: (N, V) scores.
        alpha: a float, or an (N, 1) tensor (one per row).

    Returns:
        (N,) values.
    """
    # The alpha-norm through the log: p^alpha underflows to 0 for the tiny entries it drops.
    log_p = torch.log(p)
    norm = torch.exp(torch.logsumexp(log_p * alpha, dim=-1, keepdim=True) / alpha)
    return (score_dot(p, z) - norm + 1.0).squeeze(-1)


class FenchelYoungLossFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, regularizer, label_smoothing, ignore_index):
        """logits (N, V) in their compute dtype, target (N,) int64; returns (loss, unsmoothed,
        support), each (N,). See fenchel_young_rows."""
        z = logits
        vocab = z.shape[-1]
        p = regularizer.project(z)
        valid = None if ignore_index is None else target != ignore_index
        # An ignored row's target may be any index (fairseq's padding index is one): gather
        # from index 0 there and mask the row afterwards.
        safe_target = target if valid is None else target.masked_fill(~valid, 0)
        z_target = z.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)
        conjugate = regularizer.conjugate(p, z)
        unsmoothed = conjugate - z_target
        # A target whose score is -inf is impossible: its loss is +inf (the conjugate's value
        # does not matter; on a row of -inf scores only, it is NaN).
        impossible = z_target == float("-inf")
        unsmoothed = torch.where(impossible, float("inf"), unsmoothed)
        if label_smoothing:
            off_target = label_smoothing / (vocab - 1)
            smoothed_dot = z_target * (1.0 - label_smoothing - off_target) + z.sum(dim=-1) * off_target
            loss = torch.where(impossible, float("inf"), conjugate - smoothed_dot)
        else:
            off_target = 0.0
            loss = unsmoothed.clone()
        support = torch.linalg.vector_norm(p, ord=0, dim=-1)
        if valid is not None:
            for row_values in (loss, unsmoothed, support):
                row_values.masked_fill_(~valid, 0.0)
        ctx.mark_non_differentiable(unsmoothed, support)
        ctx.save_for_backward(p, safe_target, valid)
        ctx.smoothing = (label_smoothing, off_target)
        return loss, unsmoothed, support

    @staticmethod
    def backward(ctx, grad_loss, grad_unsmoothed, grad_support):
        p, target, valid = ctx.saved_tensors
        label_smoothing, off_target = ctx.smoothing
        g = grad_loss.to(p.dtype)
        if valid is not None:
            g = g * valid
        g = g.unsqueeze(-1)
        # p - q, scaled by the upstream gradient of each row
        grad = p * g
        if off_target:
            grad.sub_(g * off_target)
        grad.scatter_add_(-1, target.unsqueeze(-1), g * -(1.0 - label_smoothing - off_target))
        # (autograd returns it in logits' dtype)
        return grad, None, None, None, None


def fenchel_young_rows(logits, target, regularizer, label_smoothing=0.0, ignore_index=None):
    """The Fenchel-Young loss of each row of scores, with p = regularizer.project(logits).

    The map runs once; the loss comes from p and the conjugate, and the backward is p - q from
    the saved p (no gradient through the map): memory is p and the gradient, plus a few values
    per row.

    Args:
        logits: (N, V) floating scores, in the dtype the map computes in (the loss comes back in
            it; the gradient in the caller's dtype when it casts). -inf scores are allowed: they
            get p = 0 and add nothing; a target whose score is -inf has loss +inf.
        target: (N,) int64 target indices in [0, V), or ignore_index.
        regularizer: a Regularizer (the map and its conjugate).
        label_smoothing: eps in [0, 1): the target is 1 - eps on the target index and
            eps / (V - 1) on every other one (the loss then leaves out Omega(q)).
        ignore_index: rows whose target is this index get loss, support and gradient 0 (None:
            no row is ignored).

    Returns:
        (loss, unsmoothed, support), each (N,): the loss (differentiable w.r.t. logits), the
        loss with the one-hot target, and the number of nonzero entries of p (float).
    """
    return FenchelYoungLossFunction.apply(logits, target, regularizer, float(label_smoothing), ignore_index)


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
