"""The entmax package's losses (entmax.losses): the Fenchel-Young losses of sparsemax, 1.5-entmax,
alpha-entmax and alpha-normmax, computed by the shared implementation that the entmax_loss
criterion uses too (fairseq_entmax.losses).

Each loss of a row of scores X and a target y is Omega*(X) - X_y (gradient p - one_hot(y)), with
p the map's output; it is 0 when p is the one-hot target and positive otherwise. -inf scores are
allowed (p = 0 there; a target whose score is -inf has loss +inf).
"""

import functools

import torch
from torch import nn

from fairseq_entmax.entmax import activations, root_finding
from fairseq_entmax.losses.fenchel_young import Regularizer, fenchel_young_rows, norm_conjugate, tsallis_conjugate
from fairseq_entmax.normalizers._common import compute_dtype

_REDUCTIONS = ("elementwise_mean", "mean", "sum", "none")


def _alpha_of_rows(alpha, rows, dtype, device):
    """A loss's alpha as a float, or as an (N, 1) tensor (from a tensor of one or N values)."""
    if not torch.is_tensor(alpha):
        return float(alpha)
    return alpha.detach().to(device=device, dtype=dtype).reshape(-1, 1).expand(rows, 1)


def _loss(X, target, project, conjugate, alpha, ignore_index=None):
    """(loss, support) of each row: (N,) in X's dtype, and (N, 1) int64.

    project(z, alpha) -> p along the last dim; conjugate(p, z, alpha) -> (N,). Rows whose target
    is ignore_index get loss and gradient 0."""
    if not (torch.is_tensor(X) and X.is_floating_point() and X.dim() >= 1):
        raise ValueError("X must be a floating point tensor of shape (n_samples, n_classes)")
    if not (torch.is_tensor(target) and not target.is_floating_point() and target.shape == X.shape[:-1]):
        raise ValueError(
            f"target must be an integer tensor of shape {tuple(X.shape[:-1])}, got "
            f"{getattr(target, 'shape', type(target).__name__)}"
        )
    rows = X.reshape(-1, X.shape[-1])
    z = rows.to(compute_dtype(rows.dtype))
    alpha = _alpha_of_rows(alpha, z.shape[0], z.dtype, z.device)
    regularizer = Regularizer(functools.partial(project, alpha=alpha), functools.partial(conjugate, alpha=alpha))
    target = target.reshape(-1).long()
    # Ignored rows are computed with target 0 and their loss set to 0 afterwards (as the package
    # does, but without an index error for a negative ignore_index): their support is kept.
    ignored = None if ignore_index is None else target == ignore_index
    if ignored is not None:
        target = target.masked_fill(ignored, 0)
    loss, _, support = fenchel_young_rows(z, target, regularizer)
    if ignored is not None:
        loss = loss.masked_fill(ignored, 0.0)
    return loss.to(X.dtype).view(X.shape[:-1]), support.long().view(*X.shape[:-1], 1)


def _sparsemax(z, alpha):
    return activations.sparsemax(z, dim=-1)


def _entmax15(z, alpha):
    return activations.entmax15(z, dim=-1)


def _entmax(z, alpha):
    return root_finding.entmax_bisect(z, alpha=alpha, dim=-1)


def _normmax(z, alpha):
    return root_finding.normmax_bisect(z, alpha=alpha, dim=-1)


def _with_support(result, return_support_size):
    return result if return_support_size else result[0]


def sparsemax_loss(X, target, k=None, return_support_size=False):
    """sparsemax loss: a sparse alternative to cross-entropy.

    Args:
        X: (n_samples, n_classes) floating scores.
        target: (n_samples,) integer targets in [0, n_classes).
        k: accepted for compatibility; the result is the same for every k.
        return_support_size: also return the support size of each row's sparsemax.

    Returns:
        (n_samples,) losses; with return_support_size, (losses, support) with support
        (n_samples, 1) int64.
    """
    return _with_support(_loss(X, target, _sparsemax, tsallis_conjugate, 2.0), return_support_size)


def sparsemax_bisect_loss(X, target, n_iter=50):
    """sparsemax loss (the package computes it by bisection; it is the same loss).

    Args:
        X: (n_samples, n_classes) floating scores.
        target: (n_samples,) integer targets in [0, n_classes).
        n_iter: accepted for compatibility.

    Returns:
        (n_samples,) losses.
    """
    return _loss(X, target, _sparsemax, tsallis_conjugate, 2.0)[0]


def entmax15_loss(X, target, k=None, return_support_size=False):
    """1.5-entmax loss: a sparse alternative to cross-entropy.

    Args:
        X: (n_samples, n_classes) floating scores.
        target: (n_samples,) integer targets in [0, n_classes).
        k: accepted for compatibility; the result is the same for every k.
        return_support_size: also return the support size of each row's 1.5-entmax.

    Returns:
        (n_samples,) losses; with return_support_size, (losses, support) with support
        (n_samples, 1) int64.
    """
    return _with_support(_loss(X, target, _entmax15, tsallis_conjugate, 1.5), return_support_size)


def entmax_bisect_loss(X, target, alpha=1.5, n_iter=50):
    """alpha-entmax loss: a sparse alternative to cross-entropy (softmax's at alpha = 1).

    Args:
        X: (n_samples, n_classes) floating scores.
        target: (n_samples,) integer targets in [0, n_classes).
        alpha: > 0, a float, or a tensor of one value or one per row (no gradient flows to it,
            as in the package).
        n_iter: accepted for compatibility.

    Returns:
        (n_samples,) losses.
    """
    return _loss(X, target, _entmax, tsallis_conjugate, alpha)[0]


def normmax_bisect_loss(X, target, alpha=2, n_iter=50):
    """alpha-normmax loss: the Fenchel-Young loss of Omega(p) = ||p||_alpha - 1.

    Args:
        X: (n_samples, n_classes) floating scores.
        target: (n_samples,) integer targets in [0, n_classes).
        alpha: > 0, a float, or a tensor of one value or one per row (no gradient flows to it).
        n_iter: accepted for compatibility.

    Returns:
        (n_samples,) losses.
    """
    return _loss(X, target, _normmax, norm_conjugate, alpha)[0]


class _GenericLoss(nn.Module):
    """A loss module: the losses of the rows whose target is not ignore_index, reduced.

    Args:
        ignore_index: rows whose target is this index get loss and gradient 0 and are not
            counted in the mean (the package ignores them only for ignore_index >= 0; here a
            negative index is ignored too, where the package fails on its index).
        reduction: "elementwise_mean" (the sum over the counted rows; 0 when there are none),
            "sum" or "none" ("mean" is taken as "elementwise_mean").
        return_support_size: also return each row's support size, (n_samples, 1) int64.
    """

    project = None
    conjugate = staticmethod(tsallis_conjugate)

    def __init__(self, ignore_index=-100, reduction="elementwise_mean", return_support_size=False):
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(_REDUCTIONS)}, got {reduction!r}")
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.return_support_size = return_support_size

    def forward(self, X, target):
        loss, support = _loss(X, target, type(self).project, type(self).conjugate, self.alpha, self.ignore_index)
        if self.reduction == "sum":
            loss = loss.sum()
        elif self.reduction in ("elementwise_mean", "mean"):
            counted = (target != self.ignore_index).sum()
            loss = loss.sum() / counted.clamp_min(1).to(loss.dtype)
        return (loss, support) if self.return_support_size else loss


class SparsemaxLoss(_GenericLoss):
    """The sparsemax loss (see sparsemax_loss); k is accepted and changes nothing."""

    project = staticmethod(_sparsemax)

    def __init__(self, k=None, ignore_index=-100, reduction="elementwise_mean", return_support_size=False):
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k
        self.alpha = 2.0


class SparsemaxBisectLoss(_GenericLoss):
    """The sparsemax loss (see sparsemax_bisect_loss); n_iter is accepted and changes nothing."""

    project = staticmethod(_sparsemax)

    def __init__(self, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)
        self.n_iter = n_iter
        self.alpha = 2.0


class Entmax15Loss(_GenericLoss):
    """The 1.5-entmax loss (see entmax15_loss); k is accepted and changes nothing."""

    project = staticmethod(_entmax15)

    def __init__(self, k=100, ignore_index=-100, reduction="elementwise_mean", return_support_size=False):
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k
        self.alpha = 1.5


class EntmaxBisectLoss(_GenericLoss):
    """The alpha-entmax loss (see entmax_bisect_loss); n_iter is accepted and changes nothing."""

    project = staticmethod(_entmax)

    def __init__(self, alpha=1.5, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)
        self.alpha = alpha
        self.n_iter = n_iter


class NormmaxBisectLoss(_GenericLoss):
    """The alpha-normmax loss (see normmax_bisect_loss); n_iter is accepted and changes nothing."""

    project = staticmethod(_normmax)
    conjugate = staticmethod(norm_conjugate)

    def __init__(self, alpha=2, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)
        self.alpha = alpha
        self.n_iter = n_iter
