"""Top-k softmax, the attention of the Explicit Sparse Transformer (Zhao et al. 2019)."""
import functools
import numbers

import torch

from fairseq_entmax.normalizers._common import check_scores, output_only_forward, shift_rows
from fairseq_entmax.normalizers.softmax import SoftmaxFunction


def topk_softmax_rows(x, out, k):
    """Softmax over the entries >= the k-th largest of each row of x (ties kept), 0 elsewhere."""
    valid = shift_rows(x, out)
    if k < x.shape[1]:
        kth_largest = torch.topk(x, k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
        dropped = x < kth_largest
    out.exp_()
    if k < x.shape[1]:
        out.masked_fill_(dropped, 0.0)
    out.div_(out.sum(dim=-1, keepdim=True))
    if valid is not None:
        out.masked_fill_(~valid, 0.0)


class TopkSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, k, dim):
        return output_only_forward(ctx, scores, dim, functools.partial(topk_softmax_rows, k=k), num_scratch=0)

    @staticmethod
    def backward(ctx, grad):
        # Dropped entries have p = 0, so the softmax VJP gives them gradient 0.
        grad_scores, _ = SoftmaxFunction.backward(ctx, grad)
        return grad_scores, None, None


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
