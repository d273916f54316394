"""Independent float64 reference implementations for the normalizer tests.

Written from the definitions with numpy (sort-based closed forms and plain bisection), so
they share no code with fairseq_entmax.normalizers.
"""

import numpy as np


def sparsemax_reference(row):
    """Classic sort-based sparsemax of a 1-D float64 array (finite or -inf entries)."""
    z = np.asarray(row, dtype=np.float64)
    finite = np.isfinite(z)
    out = np.zeros_like(z)
    if not finite.any():
        return out
    values = np.sort(z[finite])[::-1]
    cumulative = np.cumsum(values)
    k = np.arange(1, len(values) + 1)
    support = k[1 + k * values > cumulative].max()
    tau = (cumulative[support - 1] - 1) / support
    out[finite] = np.maximum(z[finite] - tau, 0)
    return out


def entmax15_reference(row):
    """Sort-based 1.5-entmax of a 1-D float64 array: p = [z/2 - tau]_+^2."""
    z = np.asarray(row, dtype=np.float64) / 2
    finite = np.isfinite(z)
    out = np.zeros_like(z)
    if not finite.any():
        return out
    values = np.sort(z[finite])[::-1]
    best_tau = None
    for k in range(1, len(values) + 1):
        top = values[:k]
        mean = top.mean()
        delta = (1 - ((top - mean) ** 2).sum()) / k
        if delta < 0:
            break
        tau = mean - np.sqrt(delta)
        if tau < values[k - 1]:
            best_tau = tau
    out[finite] = np.maximum(z[finite] - best_tau, 0) ** 2
    return out


def alpha_entmax_reference(row, alpha, iterations=200):
    """alpha-entmax of a 1-D float64 array by plain bisection (to float64 precision).

    p_i = [(alpha-1) z_i - tau]_+^(1/(alpha-1)) is evaluated, with tau = (alpha-1) t - 1, as
    exp(log1p(u_i) / (alpha-1)), u_i = (alpha-1) (z_i - t), bisecting on t: the same map
    without rounding (alpha-1) z - tau near 1, which the power amplifies as alpha -> 1.
    """
    z = np.asarray(row, dtype=np.float64)
    finite = np.isfinite(z)
    out = np.zeros_like(z)
    if not finite.any():
        return out
    shifted = z[finite] - z[finite].max()
    if alpha == 1:
        e = np.exp(shifted)
        out[finite] = e / e.sum()
        return out
    am1 = alpha - 1

    def unnormalised(t):
        u = am1 * (shifted - t)
        with np.errstate(divide="ignore"):  # log1p(-1) = -inf gives p = 0
            return np.where(u > -1, np.exp(np.log1p(np.maximum(u, -1.0)) / am1), 0.0)

    # At t = 0 the row max has p = 1 (total >= 1); at t = 1 / am1 every u <= -1 (total 0).
    lo, hi = 0.0, 1.0 / am1
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if mid in (lo, hi):  # lo and hi are adjacent floats: no later step changes them
            break
        if unnormalised(mid).sum() >= 1:
            lo = mid
        else:
            hi = mid
    p = unnormalised(lo)
    out[finite] = p / p.sum()
    return out


def topk_softmax_reference(row, k):
    """Softmax over the entries >= the k-th largest (ties kept), 0 elsewhere."""
    z = np.asarray(row, dtype=np.float64)
    out = np.zeros_like(z)
    if not np.isfinite(z).any():
        return out
    kth = np.sort(z)[::-1][min(k, len(z)) - 1]
    kept = (z >= kth) & np.isfinite(z)
    e = np.exp(z[kept] - z[kept].max())
    out[kept] = e / e.sum()
    return out


def apply_rows(reference, scores, *args):
    """Apply a 1-D reference to every row (last dim) of an array."""
    array = np.asarray(scores, dtype=np.float64)
    flat = array.reshape(-1, array.shape[-1])
    return np.stack([reference(row, *args) for row in flat]).reshape(array.shape)
