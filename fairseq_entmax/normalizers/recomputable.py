"""Each normalizer as a row map whose output is recomputed from the scores and a few numbers
per row: what blocked attention (fairseq_entmax.attention) saves instead of the probabilities.

Every map here writes p as an elementwise function of a row's scores x and its statistics:

    softmax      p = exp(x - m) / Z
    sparsemax    p = [clamp(x - m, -2) - tau]_+
    entmax15     p = [clamp((x - m) / 2, -2) - tau]_+^2 / Z
    alpha_entmax p = [clamp((alpha - 1)(x - m), -2) - tau]_+^(1 / (alpha - 1)) / Z
    topk         p = exp(max(x - m, -80)) / Z where x - m >= the k-th largest, 0 elsewhere

with m the row maximum (kept apart from tau so that extreme scores, 1e30, stay exact), tau the
threshold of the normalizer's own search and Z the row's sum (1 / Z is stored). The forward
runs the search once; `recompute` applies the same operations to the same scores with the
saved numbers, so it gives back the forward's p bit for bit, without searching again. A fully
masked row gets tau = +inf or 1 / Z = 0: zeros. The backward is each map's own VJP from p.

Blocks are (m, d) in the compute dtype; every method may overwrite the blocks it is given.
"""

import torch

from fairseq_entmax.normalizers._common import row_maxima, sparse_map_backward, uses_sync_free_path
from fairseq_entmax.normalizers.alpha_entmax import _SOFTMAX_BELOW, alpha_entmax_rows_backward, alpha_entmax_threshold
from fairseq_entmax.normalizers.entmax15 import entmax15_rows_backward, entmax15_threshold
from fairseq_entmax.normalizers.layers import FixedAlphaEntmax, LearnedAlphaEntmax, TopK
from fairseq_entmax.normalizers.sparsemax import sparsemax_threshold
from fairseq_entmax.normalizers.topk import largest_entries, topk_cut


def _reciprocal_sum(p, masked):
    """1 / (row sums of p), 0 for the masked rows (whose sum is 0)."""
    return p.sum(dim=-1, keepdim=True).reciprocal_().masked_fill_(masked, 0.0)


def _softmax_vjp(p, g):
    """p * (g - sum(p g)), written into g."""
    g.mul_(p)
    return g.addcmul_(p, g.sum(dim=-1, keepdim=True), value=-1.0)


# exp of -inf, or of what underflows, takes torch's slow path, several times slower than a
# normal number: top-k's exp runs on x - m clamped here (exp(-80) is still a normal float32)
# and its left-out keys are zeroed by a product.
_TOPK_EXP_FLOOR = -80.0


def _kept_exp(z, kth):
    """exp(z) where z >= the row's kth and z > -inf, 0 elsewhere, written into z. A kept z below
    _TOPK_EXP_FLOOR weighs exp(_TOPK_EXP_FLOOR) (< 2e-35) instead of less, in forward and
    recomputation alike."""
    kept = torch.ge(z, kth).logical_and_(z > float("-inf"))
    return z.clamp_min_(_TOPK_EXP_FLOOR).exp_().mul_(kept)


# torch.pow with a tensor exponent costs about 2 ns an entry on the CPU, exp and log a few
# tenths, but exp of what underflows takes a slow path: alpha-entmax's power runs on exponents
# clamped at -80, and subtracts a floor above exp(-80), so that what is below it is exactly 0.
_POWER_LOG_FLOOR = -80.0
_POWER_FLOOR = 2e-35


def _power(z, exponent, exponent_at_least_one):
    """[z]_+ ^ exponent (rows, 1), written into z. With every exponent >= 1 (alpha <= 2), as
    exp(max(exponent log z, _POWER_LOG_FLOOR)) less _POWER_FLOOR: a power below the floor is 0
    (z <= 0 is clamped to the smallest normal number, whose log times the exponent is below
    -80), the others are _POWER_FLOOR (2e-35) less; in forward and recomputation alike."""
    if not exponent_at_least_one:
        return z.clamp_min_(0.0).pow_(exponent)
    tiny = torch.finfo(z.dtype).tiny
    z.clamp_min_(tiny).log_().mul_(exponent).clamp_min_(_POWER_LOG_FLOOR)
    return z.exp_().sub_(_POWER_FLOOR).clamp_min_(0.0)


def _reaches_threshold(z, tau):
    """Whether z (rows, n), computed from the scores as the forward computes it, reaches the
    row's tau less 1e-3, a margin against the rounding of a tau found on fewer scores."""
    return torch.ge(z, tau - 1e-3)


class SoftmaxRows:
    """softmax; statistics (m, 1 / Z)."""

    learns_alpha = False
    # Whether a row's p has zeros worth skipping (blocked attention's support map).
    is_sparse = False
    # The share of BLOCK_ELEMENTS (blocked attention) its blocks of scores take. 1.5-entmax's
    # and alpha-entmax's searches hold more scratch: half the elements keep their peak
    # resident memory within 2x SDPA's at about the same speed (benchmarks/RESULTS.md).
    block_share = 1.0
    # Whether the statistics found on a row's candidate keys alone (the others -inf) hold for
    # the whole row: those of the maps whose threshold depends only on the keys with weight.
    stats_from_candidates = True

    def block_params(self, scores, first_head):
        return None

    def forward(self, x, params):
        m, masked = row_maxima(x)
        p = x.sub_(m).exp_()
        inverse_sum = _reciprocal_sum(p, masked)
        return p.mul_(inverse_sum), (m, inverse_sum)

    def recompute(self, x, stats, params):
        m, inverse_sum = stats
        return x.sub_(m).exp_().mul_(inverse_sum)

    def backward(self, p, g, params, need_alpha_grad):
        return _softmax_vjp(p, g), None


class SparsemaxRows:
    """sparsemax; statistics (m, tau)."""

    learns_alpha = False
    is_sparse = True
    block_share = 1.0
    stats_from_candidates = True

    def block_params(self, scores, first_head):
        return None

    def may_weigh(self, x, stats, params):
        """Whether each score of x (rows, n) may have weight, by the row statistics of a
        forward (blocked attention's support map): False only where it has none. Statistics
        found on a subset of a row's scores serve too, since adding scores to a row only
        raises its threshold. z is computed as the forward computes it, so that rounding
        cannot drop a score with weight. (Fully masked rows are the caller's to leave out.)"""
        m, tau = stats[0], stats[1]
        return _reaches_threshold(x - m, tau)

    def forward(self, x, params):
        m, masked = row_maxima(x)
        z = x.sub_(m).clamp_min_(-2.0)
        tau = sparsemax_threshold(z, torch.empty_like(z)).masked_fill_(masked, float("inf"))
        return z.sub_(tau).clamp_min_(0.0), (m, tau)

    def recompute(self, x, stats, params):
        m, tau = stats
        return x.sub_(m).clamp_min_(-2.0).sub_(tau).clamp_min_(0.0)

    def backward(self, p, g, params, need_alpha_grad):
        sparse_map_backward(g, p.sign_(), g)
        return g, None


class Entmax15Rows:
    """1.5-entmax; statistics (m, tau, 1 / Z)."""

    learns_alpha = False
    is_sparse = True
    block_share = 0.5
    stats_from_candidates = True

    def block_params(self, scores, first_head):
        return None

    def may_weigh(self, x, stats, params):
        m, tau = stats[0], stats[1]
        return _reaches_threshold((x - m).mul_(0.5), tau)

    def forward(self, x, params):
        m, masked = row_maxima(x)
        z = x.sub_(m).mul_(0.5).clamp_min_(-2.0)
        tau = entmax15_threshold(z, torch.empty_like(z)).masked_fill_(masked, float("inf"))
        p = z.sub_(tau).clamp_min_(0.0).square_()
        inverse_sum = _reciprocal_sum(p, masked)
        return p.mul_(inverse_sum), (m, tau, inverse_sum)

    def recompute(self, x, stats, params):
        m, tau, inverse_sum = stats
        return x.sub_(m).mul_(0.5).clamp_min_(-2.0).sub_(tau).clamp_min_(0.0).square_().mul_(inverse_sum)

    def backward(self, p, g, params, need_alpha_grad):
        entmax15_rows_backward(p, g, g, torch.empty_like(p))
        return g, None


class AlphaEntmaxRows:
    """alpha-entmax with one alpha per head; statistics (m, tau, 1 / Z). Rows whose alpha - 1 is
    below the softmax limit of alpha_entmax are softmax, with (m, 1 / Z) of their own.

    Args:
        alpha: (heads,) tensor, the alpha of each head.
        at_most_two: alpha is known to be <= 2 (the sync-free path's choice of search).
    """

    learns_alpha = True
    is_sparse = True
    block_share = 0.5
    stats_from_candidates = True

    def __init__(self, alpha, at_most_two):
        self.alpha = alpha
        self.at_most_two = at_most_two

    def block_params(self, scores, first_head):
        """Of a block of scores (batch, heads, queries, keys) of the heads from first_head on:
        alpha - 1 per row (rows, 1) in its dtype, which rows are softmax (None when none is),
        and the alpha - 1 the search and the power take (1 on the softmax rows, whose p is
        replaced)."""
        batch, heads, queries, _ = scores.shape
        alpha = self.alpha[first_head : first_head + heads].to(scores.dtype)
        am1 = (alpha - 1.0).view(1, heads, 1, 1).expand(batch, heads, queries, 1).reshape(-1, 1)
        is_softmax = am1 < _SOFTMAX_BELOW[am1.dtype]
        if not uses_sync_free_path(scores) and not bool(is_softmax.any()):
            return am1, None, am1
        return am1, is_softmax, am1.masked_fill(is_softmax, 1.0)

    def may_weigh(self, x, stats, params):
        (m, tau, _), (_, is_softmax, searched) = stats, params
        weighs = _reaches_threshold((x - m).mul_(searched), tau)
        return weighs if is_softmax is None else weighs.logical_or_(is_softmax)

    def forward(self, x, params):
        _, is_softmax, searched = params
        raw = None if is_softmax is None else x.clone()
        m, masked = row_maxima(x)
        z = x.sub_(m).mul_(searched).clamp_min_(-2.0)
        scratch = [torch.empty_like(z) for _ in range(3)]
        tau = alpha_entmax_threshold(z, searched, masked, scratch, self.at_most_two).masked_fill_(masked, float("inf"))
        p = _power(z.sub_(tau), searched.reciprocal(), self.at_most_two)
        inverse_sum = _reciprocal_sum(p, masked)
        p.mul_(inverse_sum)
        if is_softmax is not None:
            soft = raw.sub_(m).exp_()
            soft_inverse_sum = _reciprocal_sum(soft, masked)
            p = torch.where(is_softmax, soft.mul_(soft_inverse_sum), p)
            inverse_sum = torch.where(is_softmax, soft_inverse_sum, inverse_sum)
        return p, (m, tau, inverse_sum)

    def recompute(self, x, stats, params):
        m, tau, inverse_sum = stats
        _, is_softmax, searched = params
        raw = None if is_softmax is None else x.clone()
        p = _power(x.sub_(m).mul_(searched).clamp_min_(-2.0).sub_(tau), searched.reciprocal(), self.at_most_two)
        p.mul_(inverse_sum)
        if is_softmax is not None:
            p = torch.where(is_softmax, raw.sub_(m).exp_().mul_(inverse_sum), p)
        return p

    def backward(self, p, g, params, need_alpha_grad):
        am1 = params[0]
        grad = torch.empty_like(g)
        scratch = [torch.empty_like(g) for _ in range(3)]
        alpha_rows = alpha_entmax_rows_backward(p, g, grad, am1, need_alpha_grad, *scratch)
        return grad, alpha_rows


class TopKRows:
    """top-k softmax; statistics (m, a cut of x - m between its k-th and (k+1)-th largest
    (topk_cut), 1 / Z).

    Args:
        normalizer: the TopK module, which says how many keys each row keeps.
    """

    learns_alpha = False
    is_sparse = True
    block_share = 1.0
    # Its cut lies halfway to the (k+1)-th largest score, which may be outside the candidates.
    stats_from_candidates = False

    def __init__(self, normalizer):
        self.normalizer = normalizer

    def block_params(self, scores, first_head):
        """The keys kept per row of a block of scores (batch, heads, queries, keys): an int, or
        a (rows, 1) tensor when counted from the visible keys."""
        k = self.normalizer.keys_kept(scores)
        return k if isinstance(k, int) else k.reshape(-1, 1)

    def may_weigh(self, x, stats, params):
        m, kth = stats[0], stats[1]  # weight where x - m >= the cut
        return _reaches_threshold(x - m, kth)

    def forward(self, x, params):
        m, masked = row_maxima(x)
        z = x.sub_(m)
        kth = topk_cut(z, params)
        if kth is None:
            kth = torch.full_like(m, float("-inf"))
        p = _kept_exp(z, kth)
        inverse_sum = _reciprocal_sum(p, masked)
        return p.mul_(inverse_sum), (m, kth, inverse_sum)

    def recompute(self, x, stats, params):
        m, kth, inverse_sum = stats
        return _kept_exp(x.sub_(m), kth).mul_(inverse_sum)

    def kept_keys(self, x, params):
        """The forward of the rows of x (rows, n) as their kept keys alone, the same weights
        as forward's: (columns (rows, k) of the kept keys, their weights (rows, k)). None
        where a row keeps more than k keys (a tie with its k-th largest), k is per row or
        covers the row, or a row holds a NaN or +inf."""
        if not isinstance(params, int) or params >= x.shape[1]:
            return None
        values, columns = largest_entries(x, params + 1)
        kth, following = values[:, params - 1 : params], values[:, params:]
        m, masked = row_maxima(values)
        if bool(((following == kth) & (kth > float("-inf")) | (m != m) | (m == float("inf"))).any()):
            return None
        values, columns = values[:, :params].contiguous(), columns[:, :params].contiguous()
        # Each of the k is at or above the row's k-th largest: only a -inf (a row with fewer
        # than k visible keys) is left out.
        p = _kept_exp(values.sub_(m), float("-inf"))
        return columns, p.mul_(_reciprocal_sum(p, masked))

    def backward(self, p, g, params, need_alpha_grad):
        return _softmax_vjp(p, g), None


_FIXED = {"softmax": SoftmaxRows, "sparsemax": SparsemaxRows, "entmax15": Entmax15Rows}


def recomputable_rows(normalizer):
    """The row map of a normalizer module, for blocked attention.

    Args:
        normalizer: an AttentionNormalizer from build_normalizer.

    Returns:
        (row map, the (heads,) alpha tensor it reads, differentiable, or None).

    Raises:
        TypeError: for a normalizer module this package did not define.
    """
    if isinstance(normalizer, FixedAlphaEntmax) and normalizer.name in _FIXED:
        return _FIXED[normalizer.name](), None
    if isinstance(normalizer, LearnedAlphaEntmax):
        alpha = normalizer.head_alpha()
        return AlphaEntmaxRows(alpha, at_most_two=normalizer.clamp[1] <= 2.0), alpha
    if isinstance(normalizer, TopK):
        return TopKRows(normalizer), None
    raise TypeError(
        f"normalizer: {type(normalizer).__name__} is not a normalizer of fairseq_entmax.normalizers; "
        "give a name or a module from build_normalizer"
    )
