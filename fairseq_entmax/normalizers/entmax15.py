"""1.5-entmax (Peters, Niculae, Martins 2019): p_i = [z_i / 2 - tau]_+^2, sum_i p_i = 1."""
import torch

from fairseq_entmax.normalizers._common import check_scores, compute_dtype, shift_by_row_max
from fairseq_entmax.normalizers.sparsemax import sparse_map_backward


def entmax15_threshold(z):
    """Exact tau with sum_i [z_i - tau]_+^2 = 1 along the last dim (rows of z have max 0).

    Sort-based: for the k largest entries, tau_k = mean_k - sqrt((1 - k * var_k) / k); the
    support is the largest k with tau_k < z_(k).
    """
    d = z.shape[-1]
    z_sorted = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, d + 1, dtype=z.dtype, device=z.device)
    mean = z_sorted.cumsum(dim=-1).div_(k)
    mean_sq = z_sorted.square().cumsum(dim=-1).div_(k)
    # (1 - k * var_k) / k; negative when the k entries alone already have too much mass.
    delta = (1.0 / k) - (mean_sq - mean.square())
    tau_k = mean - delta.clamp_min_(0.0).sqrt_()
    support_size = (tau_k < z_sorted).sum(dim=-1, keepdim=True)
    return tau_k.gather(-1, support_size - 1)


def entmax15_forward(x):
    """1.5-entmax along the last dim of x (any float dtype, computed in that dtype)."""
    z, valid = shift_by_row_max(x)
    # p_i = [z_i / 2 - tau]^2 with tau >= max / 2 - 1 = -1: entries with z_i / 2 < -1 never
    # enter the support, so clamping at -2 removes -inf and 1e30 without changing p.
    z = z.mul_(0.5).clamp_min_(-2.0)
    tau = entmax15_threshold(z)
    p = z.sub_(tau).clamp_min_(0.0).square_()
    return p.mul_(valid)


class Entmax15Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dim):
        x = scores.movedim(dim, -1)
        ctx.dim = dim
        if x.numel() == 0:
            out = scores.clone()
        else:
            out = entmax15_forward(x.to(compute_dtype(x.dtype))).to(x.dtype).movedim(-1, dim)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        if out.numel() == 0:
            return torch.zeros_like(out), None
        p = out.movedim(ctx.dim, -1)
        work_dtype = compute_dtype(p.dtype)
        # Jacobian diag(s) - s s^T / sum(s) with s = p^(2 - alpha) = sqrt(p).
        s = p.to(work_dtype).sqrt()
        g = grad.movedim(ctx.dim, -1).to(work_dtype)
        return sparse_map_backward(g, s).to(out.dtype).movedim(-1, ctx.dim), None


def entmax15(scores, dim=-1):
    """1.5-entmax along `dim` (alpha-entmax with alpha = 1.5, exact threshold).

    -inf scores get weight and gradient exactly 0; an all -inf row gives zeros.
    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    check_scores(scores, dim, "entmax15")
    return Entmax15Function.apply(scores, dim)
