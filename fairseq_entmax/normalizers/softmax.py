"""softmax with the masking convention of this package: an all -inf row gives zeros."""

import torch

from fairseq_entmax.normalizers._common import check_scores, compute_dtype, uses_sync_free_path


def softmax_forward(x, dim):
    """torch.softmax along `dim` in x's dtype, with all -inf rows set to zero (not NaN)."""
    p = torch.softmax(x, dim=dim)
    if p.numel() == 0:
        return p
    # Only an all -inf (or NaN) row has NaN in its first entry; checking that one entry
    # per row keeps the usual case at the cost of torch.softmax itself. The sync-free path
    # cannot read that check back and masks every call.
    if uses_sync_free_path(x) or torch.isnan(p.narrow(dim, 0, 1)).any():
        fully_masked = x.amax(dim=dim, keepdim=True) == float("-inf")
        p.masked_fill_(fully_masked, 0.0)
    return p


def softmax_backward(grad, out, dim):
    """Vector-Jacobian product of softmax, p * (grad - sum(p * grad)), for the output `out`
    of a softmax (or top-k softmax) along dim: computed in the compute dtype, returned in
    out's."""
    p = out.to(compute_dtype(out.dtype))
    return torch._softmax_backward_data(grad.to(p.dtype), p, dim, p.dtype).to(out.dtype)


class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dim):
        p = softmax_forward(scores.to(compute_dtype(scores.dtype)), dim)
        out = p.to(scores.dtype)
        ctx.dim = dim
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return softmax_backward(grad, out, ctx.dim), None


def softmax(scores, dim=-1):
    """Softmax along `dim`; -inf scores get weight 0 and an all -inf row gives all zeros.

    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    dim = check_scores(scores, dim, "softmax")
    return SoftmaxFunction.apply(scores, dim)
