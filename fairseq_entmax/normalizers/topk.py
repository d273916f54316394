"""Top-k softmax, the attention of the Explicit Sparse Transformer (Zhao et al. 2019)."""

import functools
import numbers

import torch

from fairseq_entmax.normalizers._common import (
    as_rows,
    check_scores,
    check_values,
    output_only_forward,
    shift_rows,
    uses_sync_free_path,
)
from fairseq_entmax.normalizers.softmax import softmax_backward


def topk_softmax_rows(x, out, k):
    """Softmax over the entries >= the k-th largest of each row of x (ties kept), 0 elsewhere.
    k: a python int, or a (rows, 1) integer tensor with each row's k."""
    valid = shift_rows(x, out)
    kth = topk_threshold(x, k)
    out.exp_()
    if kth is not None:
        out.masked_fill_(x < kth, 0.0)
    out.div_(out.sum(dim=-1, keepdim=True))
    if valid is not None:
        out.masked_fill_(~valid, 0.0)


def topk_threshold(x, k):
    """The k-th largest entry of each row of the (m, d) block x, the smallest that top-k
    keeps (ties kept), or None where k >= d for every row (all kept).

    Args:
        x: (m, d) block.
        k: a python int, or a (m, 1) integer tensor with each row's k.

    Returns:
        (m, 1) tensor in x's dtype, or None.
    """
    d = x.shape[1]
    if torch.is_tensor(k):
        k, largest = _largest_of_rows(x, k, 0)
        return largest.gather(-1, k - 1)
    if k < d:
        return largest_entries(x, k, ordered=False)[0].amin(dim=-1, keepdim=True)
    return None


def _largest_of_rows(x, k, more):
    """Each row's k (a (m, 1) tensor) clamped to d, and the sorted max(k) + more largest entries
    of every row of the (m, d) block x: all of them on the sync-free path, which cannot read
    max(k)."""
    d = x.shape[1]
    k = k.clamp(max=d)
    kept = d if uses_sync_free_path(x) else min(int(k.max()) + more, d)
    return k, torch.topk(x, kept, dim=-1, sorted=True).values


def topk_cut(x, k):
    """A threshold between the k-th and the (k+1)-th largest entry of each row of the (m, d)
    block x: the entries at or above it are those top-k keeps (ties kept), as with
    topk_threshold. Blocked attention recomputes the scores in other shapes, whose products may
    round otherwise; halfway between the two, the cut keeps the same keys whenever the rounding
    is below half their gap, where the k-th largest itself would lose the k-th key to one ulp.

    Args:
        x: (m, d) block.
        k: a python int, or a (m, 1) integer tensor with each row's k.

    Returns:
        (m, 1) tensor in x's dtype, or None where k >= d for every row (all kept).
    """
    d = x.shape[1]
    if torch.is_tensor(k):
        k, largest = _largest_of_rows(x, k, 1)
        kth = largest.gather(-1, k - 1)
        following = largest.gather(-1, k.clamp(max=largest.shape[1] - 1)).masked_fill_(k >= d, float("-inf"))
    elif k >= d:
        return None
    else:
        last_two = largest_entries(x, k + 1, ordered=False)[0] if k + 1 < d else x
        following, kth = torch.topk(last_two, 2, dim=-1, largest=False, sorted=True).values.split(1, dim=-1)
    halfway = kth.mul(0.5).add_(following, alpha=0.5)
    # Where the two are adjacent numbers, halfway rounds onto one of them: the k-th itself then.
    return torch.where(halfway > following, halfway, kth)


# Rows at least this many times longer than the chunks of 64 that may hold their largest
# entries are searched by chunks of 64 (largest_entries). So are rows of 256 keys or more where
# torch.topk takes its slower path, with count * 64 > d, in chunks of d / 64: there torch.topk
# took 7.1 ms for the 9 largest of 512 keys (2^20 entries, 1 thread), 3.2 ms for the 8 largest,
# and the chunks 3.9 ms.
_CHUNK = 64
_CHUNKED_FROM = 4
_CHUNKED_SHORT_FROM = 256


def _chunk_length(d, count):
    """The length of the chunks largest_entries searches rows of d entries by, or None for
    torch.topk over whole rows."""
    if d >= _CHUNKED_FROM * count * _CHUNK:
        return _CHUNK
    if count * _CHUNK > d >= _CHUNKED_SHORT_FROM:
        return d // _CHUNK
    return None


def largest_entries(x, count, ordered=True):
    """The count largest entries of each row of the (m, d) block x, for count < d (ordered:
    in descending order; otherwise in any order, which saves torch.topk a sort).

    A long row is searched in two steps: the maxima of its chunks, then the entries of the
    count chunks with the largest maxima (and the tail). Those hold the row's count largest
    values: a chunk left out has a maximum no larger than those of count chunks that were
    kept. torch.topk over a whole row costs up to twice as much.

    Returns:
        (values, indices), each (m, count); tied entries in any order.
    """
    rows, d = x.shape
    chunk = _chunk_length(d, count)
    if chunk is None:
        return torch.topk(x, count, dim=-1, sorted=ordered)
    chunks = d // chunk
    maxima = x[:, : chunks * chunk].view(rows, chunks, chunk).amax(dim=-1)
    chosen = torch.topk(maxima, count, dim=-1, sorted=False).indices
    candidates = gather_chunks(x, chosen, chunk)
    # Where each candidate lies: the same chunks of the rows' column numbers.
    columns = gather_chunks(torch.arange(d, device=x.device).expand(rows, d), chosen, chunk)
    values, where = torch.topk(candidates, count, dim=-1, sorted=ordered)
    return values, columns.gather(-1, where)


def gather_chunks(x, chosen, chunk):
    """The chunks of `chunk` entries that chosen (m, n) names in each row of the (m, d) block x,
    one after the other, then the row's tail past its last whole chunk.

    Returns:
        (m, n * chunk + d % chunk), in x's dtype.
    """
    rows, d = x.shape
    whole = d // chunk * chunk
    by_chunk = x[:, :whole].view(rows, whole // chunk, chunk)
    gathered = torch.gather(by_chunk, 1, chosen.unsqueeze(-1).expand(-1, -1, chunk)).view(rows, -1)
    return torch.cat([gathered, x[:, whole:]], dim=-1) if whole < d else gathered


class TopkSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, k, dim):
        """k: a python int, or an integer tensor of scores' shape but 1 along dim."""
        if torch.is_tensor(k):
            k_rows, _ = as_rows(k, dim)
            return output_only_forward(ctx, scores, dim, topk_softmax_rows, num_scratch=0, row_params=(k_rows,))
        return output_only_forward(ctx, scores, dim, functools.partial(topk_softmax_rows, k=k), num_scratch=0)

    @staticmethod
    def backward(ctx, grad):
        # Dropped entries have p = 0, so the softmax VJP gives them gradient 0.
        (out,) = ctx.saved_tensors
        return softmax_backward(grad, out, ctx.dim), None, None


def topk_softmax(scores, k, dim=-1):
    """Keep the entries >= the k-th largest score of each row along `dim` (ties are kept),
    give the others weight 0 and gradient 0, and take the softmax over the kept ones.

    k is a python int >= 1, the same for every row, or an integer tensor of values >= 1
    broadcastable to scores with size 1 along dim: one k per row (e.g. a share of each
    query's unmasked keys). k >= the row length gives plain softmax. -inf scores get weight
    0; an all -inf row gives zeros. float16/bfloat16 are computed in float32.
    """
    dim = check_scores(scores, dim, "topk_softmax")
    allowed = (
        "k must be an integer >= 1 (keys kept per row), or an integer tensor of such values "
        "broadcastable to scores with size 1 along dim"
    )
    if torch.is_tensor(k):
        if k.is_floating_point() or k.is_complex() or k.dtype == torch.bool:
            raise ValueError(f"topk_softmax: got k of dtype {k.dtype}; {allowed}")
        shape = list(scores.shape)
        shape[dim] = 1
        try:
            k = k.to(device=scores.device, dtype=torch.long).expand(shape)
        except RuntimeError:
            raise ValueError(
                f"topk_softmax: k of shape {tuple(k.shape)} does not fit scores of shape "
                f"{tuple(scores.shape)} with dim={dim}; {allowed}"
            ) from None
        if k.numel():
            check_values(k, k >= 1, "topk_softmax: k contains {value}; " + allowed)
    elif isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"topk_softmax: k must be an integer >= 1 (keys kept per row), got {k!r}")
    else:
        k = int(k)
    return TopkSoftmaxFunction.apply(scores, k, dim)
