"""sparsemax (Martins & Astudillo 2016): the Euclidean projection onto the simplex."""
import torch

from fairseq_entmax.normalizers._common import check_scores, compute_dtype, shift_by_row_max


def sparsemax_threshold(z):
    """Exact tau with sum_i [z_i - tau]_+ = 1 along the last dim (rows of z have max 0).

    Sort-based: the support is the k largest entries for the largest k with
    1 + k * z_(k) > sum_{j<=k} z_(j).
    """
    d = z.shape[-1]
    z_sorted = torch.sort(z, dim=-1, descending=True).values
    cumsum = z_sorted.cumsum(dim=-1).sub_(1.0)
    k = torch.arange(1, d + 1, dtype=z.dtype, device=z.device)
    support_size = (k * z_sorted > cumsum).sum(dim=-1, keepdim=True)
    return cumsum.gather(-1, support_size - 1) / support_size.to(z.dtype)


def sparsemax_forward(x):
    """sparsemax along the last dim of x (any float dtype, computed in that dtype)."""
    z, valid = shift_by_row_max(x)
    # tau >= max - 1 = -1, so entries below -1 never enter the support: clamping them
    # to -2 removes -inf and huge magnitudes (1e30) without changing the result.
    z = z.clamp_min_(-2.0)
    tau = sparsemax_threshold(z)
    p = z.sub_(tau).clamp_min_(0.0)
    return p.mul_(valid)


def sparse_map_backward(grad, s):
    """VJP of a map whose Jacobian is diag(s) - s s^T / sum(s) (sparsemax, entmax).

    s is 0 outside the support, so masked and zero-weight entries get gradient 0; rows
    with sum(s) == 0 (fully masked) get 0 too.
    """
    s_grad = s * grad
    coef = s_grad.sum(dim=-1, keepdim=True) / s.sum(dim=-1, keepdim=True).clamp_min_(1e-30)
    return s_grad.sub_(s * coef)


class SparsemaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dim):
        x = scores.movedim(dim, -1)
        ctx.dim = dim
        if x.numel() == 0:
            out = scores.clone()
        else:
            out = sparsemax_forward(x.to(compute_dtype(x.dtype))).to(x.dtype).movedim(-1, dim)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        if out.numel() == 0:
            return torch.zeros_like(out), None
        p = out.movedim(ctx.dim, -1)
        work_dtype = compute_dtype(p.dtype)
        s = (p > 0).to(work_dtype)
        g = grad.movedim(ctx.dim, -1).to(work_dtype)
        return sparse_map_backward(g, s).to(out.dtype).movedim(-1, ctx.dim), None


def sparsemax(scores, dim=-1):
    """sparsemax along `dim`: argmin_p ||p - scores||^2 over the simplex (exact threshold).

    -inf scores get weight and gradient exactly 0; an all -inf row gives zeros.
    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    check_scores(scores, dim, "sparsemax")
    return SparsemaxFunction.apply(scores, dim)
