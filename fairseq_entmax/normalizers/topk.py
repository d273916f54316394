"""Top-k softmax, the attention of the Explicit Sparse Transformer (Zhao et al. 2019)."""
import numbers

import torch

from fairseq_entmax.normalizers._common import check_scores, compute_dtype
from fairseq_entmax.normalizers.softmax import softmax_backward, softmax_forward


def topk_softmax_forward(x, k, dim):
    """Softmax over the entries >= the k-th largest of each row (ties kept), 0 elsewhere."""
    if k < x.shape[dim]:
        kth_largest = torch.topk(x, k, dim=dim, sorted=False).values.amin(dim=dim, keepdim=True)
        x = x.masked_fill(x < kth_largest, float("-inf"))
    return softmax_forward(x, dim)


class TopkSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, k, dim):
        p = topk_softmax_forward(scores.to(compute_dtype(scores.dtype)), k, dim)
        out = p.to(scores.dtype)
        ctx.dim = dim
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        # Dropped entries have p = 0, so the softmax VJP gives them gradient 0.
        (out,) = ctx.saved_tensors
        p = out.to(compute_dtype(out.dtype))
        grad_scores = softmax_backward(grad.to(p.dtype), p, ctx.dim)
        return grad_scores.to(out.dtype), None, None


def topk_softmax(scores, k, dim=-1):
    """Keep the entries >= the k-th largest score of each row along `dim` (ties are kept),
    give the others weight 0 and gradient 0, and take the softmax over the kept ones.

    k is a python int >= 1; k >= the row length gives plain softmax. -inf scores get weight
    0; an all -inf row gives zeros. float16/bfloat16 are computed in float32.
    """
    check_scores(scores, dim, "topk_softmax")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"topk_softmax: k must be an integer >= 1 (keys kept per row), got {k!r}")
    return TopkSoftmaxFunction.apply(scores, int(k), dim)
