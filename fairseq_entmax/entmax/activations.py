"""sparsemax and 1.5-entmax with the entmax package's interface (entmax.activations), computed by
this project's normalizers.

`k`, the package's partial-sort hint, is accepted and changes nothing: the normalizers find the
exact threshold without sorting, so the result is the same for every k.
"""

from torch import nn

from fairseq_entmax import normalizers


def _support_size(p, dim):
    """The number of nonzero entries of p along dim, int64 with size 1 along dim (as the package
    returns it)."""
    return (p > 0).sum(dim=dim, keepdim=True)


def _with_support(p, dim, return_support_size):
    if return_support_size:
        return p, _support_size(p, dim)
    return p


def sparsemax(X, dim=-1, k=None, return_support_size=False):
    """sparsemax: the Euclidean projection of X onto the simplex along dim.

    Solves min_p ||X - p||_2 s.t. p >= 0, sum(p) = 1.

    Args:
        X: floating tensor of scores (-inf allowed: weight and gradient 0; a row of -inf only
            gives zeros).
        dim: the dim to normalize along.
        k: accepted for compatibility; the result is the same for every k.
        return_support_size: also return the number of nonzeros of each row.

    Returns:
        P of X's shape and dtype, summing to 1 along dim; with return_support_size,
        (P, support) with support int64 of X's shape but 1 along dim.
    """
    p = normalizers.sparsemax(X, dim)
    return _with_support(p, dim, return_support_size)


def entmax15(X, dim=-1, k=None, return_support_size=False):
    """1.5-entmax: max_p <X, p> + H_1.5(p) s.t. p >= 0, sum(p) = 1, with H_1.5 the Tsallis
    entropy of alpha = 1.5.

    Args:
        X: floating tensor of scores (-inf allowed: weight and gradient 0; a row of -inf only
            gives zeros).
        dim: the dim to normalize along.
        k: accepted for compatibility; the result is the same for every k.
        return_support_size: also return the number of nonzeros of each row.

    Returns:
        P of X's shape and dtype, summing to 1 along dim; with return_support_size,
        (P, support) with support int64 of X's shape but 1 along dim.
    """
    p = normalizers.entmax15(X, dim)
    return _with_support(p, dim, return_support_size)


def _sparsemax_threshold_and_support(X, dim=-1, k=None):
    """The threshold tau and support size of sparsemax: sum_i [X_i - tau]_+ = 1 along dim.

    Args:
        X: floating tensor of scores.
        dim: the dim to find the threshold along.
        k: accepted for compatibility; the result is the same for every k.

    Returns:
        (tau, support_size), both of X's shape but 1 along dim; support_size is int64.
    """
    p = normalizers.sparsemax(X, dim)
    # p_i = X_i - tau on the support, and the largest score is in it with p at least 1 / d.
    x_max, argmax = X.max(dim=dim, keepdim=True)
    tau = x_max - p.gather(dim, argmax)
    return tau, _support_size(p, dim)


def _entmax_threshold_and_support(X, dim=-1, k=None):
    """The threshold tau and support size of 1.5-entmax of 2 X: sum_i [X_i - tau]_+^2 = 1 along
    dim (the package's scale: its entmax15 halves the scores first).

    Args:
        X: floating tensor of (halved) scores.
        dim: the dim to find the threshold along.
        k: accepted for compatibility; the result is the same for every k.

    Returns:
        (tau, support_size), both of X's shape but 1 along dim; support_size is int64.
    """
    p = normalizers.entmax15(2 * X, dim)
    # p_i = (X_i - tau)^2 on the support, which holds the largest score with p >= 1 / d.
    x_max, argmax = X.max(dim=dim, keepdim=True)
    tau = x_max - p.gather(dim, argmax).sqrt()
    return tau, _support_size(p, dim)


class _Map(nn.Module):
    """A map along dim as a module, with the package's arguments.

    Args:
        dim: the dim to normalize along.
        k: accepted for compatibility; the result is the same for every k.
        return_support_size: also return the number of nonzeros of each row.
    """

    def __init__(self, dim=-1, k=None, return_support_size=False):
        super().__init__()
        self.dim = dim
        self.k = k
        self.return_support_size = return_support_size

    def forward(self, X):
        return self.map(X, dim=self.dim, k=self.k, return_support_size=self.return_support_size)


class Sparsemax(_Map):
    """sparsemax along dim (see sparsemax)."""

    map = staticmethod(sparsemax)


class Entmax15(_Map):
    """1.5-entmax along dim (see entmax15)."""

    map = staticmethod(entmax15)
