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
    """alpha-entmax of a 1-D float64 array by plain bisection on tau (to float64 precision)."""
    z = np.asarray(row, dtype=np.float64)
    finite = np.isfinite(z)
    out = np.zeros_like(z)
    if not finite.any():
        return out
    if alpha == 1:
        e = np.exp(z[finite] - z[finite].max())
        out[finite] = e / e.sum()
        return out
    scaled = (alpha - 1) * (z[finite] - z[finite].max())

    def mass(tau):
        return (np.maximum(scaled - tau, 0) ** (1 / (alpha - 1))).sum()

    lo, hi = -1.0, 0.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if mass(mid) >= 1:
            lo = mid
        else:
            hi = mid
    p = np.maximum(scaled - lo, 0) ** (1 / (alpha - 1))
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
