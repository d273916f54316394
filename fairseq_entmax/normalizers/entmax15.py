"""1.5-entmax (Peters, Niculae, Martins 2019): p_i = [z_i / 2 - tau]_+^2, sum_i p_i = 1."""
import torch

from fairseq_entmax.normalizers._common import (
    WIDE_BLOCK_SCALE,
    check_scores,
    output_only_backward,
    output_only_forward,
    shift_rows,
    sparse_map_backward,
)

# Safety bound on the passes of the threshold search; attention rows need 4 to 8.
_MAX_PASSES = 64


def _support_stats(z, tau, r):
    """For r = [z - tau]_+: sum r, sum r^2 and the support size, per row (r is scratch)."""
    torch.sub(z, tau, out=r).clamp_min_(0.0)
    s1 = r.sum(dim=-1, keepdim=True)
    s2 = torch.linalg.vector_norm(r, dim=-1, keepdim=True).square_()
    count = r.sign_().sum(dim=-1, keepdim=True)  # sign: far cheaper than r > 0
    return s1, s2, count


def entmax15_rows(x, out, r):
    """1.5-entmax of each row of the block x into out; r is a scratch block.

    The threshold tau solves f(tau) = sum [z - tau]_+^2 = 1 (z = x / 2, row max 0). It is
    found exactly without sorting. From a point tau below the root (f >= 1), two candidates:
    - the exact root of sum_{S} (z - t)^2 = 1 for the current support S = {z > tau}: it is
      the answer when S is the true support, but may pass the root otherwise;
    - a Newton step on the norm F(tau) = ||[z - tau]_+||_2, which is convex and decreasing,
      so the step never passes the root, and nearly linear, so it gets close fast.
    The exact candidate is tried once the support held still over the last step, and when
    it is the larger one; if its support is still S,
    S is the true support and the candidate is the exact threshold. If it passed the root
    (f < 1), the next pass takes the Newton step instead. A Newton candidate cannot pass
    the root: if it seems to, or if f at a candidate is 1 up to rounding, the row is done.
    """
    valid = shift_rows(x, out)
    # tau >= max / 2 - 1 = -1, so entries with z / 2 < -1 never enter the support: clamping
    # them to -2 removes -inf and huge magnitudes (1e30) without changing the result.
    z = out.mul_(0.5).clamp_min_(-2.0)
    tau = z.new_full((z.shape[0], 1), -1.0)
    s1, s2, count = _support_stats(z, tau, r)
    previous_count = torch.full_like(count, -1.0)  # support size at the previous point
    newton_only = torch.zeros_like(count, dtype=torch.bool)
    done = torch.zeros_like(newton_only)
    mass_tolerance = 4 * torch.finfo(z.dtype).eps
    for _ in range(_MAX_PASSES):
        discriminant = s1.square() - count * (s2 - 1.0)
        exact = tau + (s1 - discriminant.clamp_min(0.0).sqrt()) / count
        newton = tau + (s2 - s2.sqrt()) / s1
        # The exact candidate is tried once the support held still over the last step:
        # tried earlier, it mostly passes the root and wastes a pass.
        use_exact = (discriminant >= 0) & (exact >= newton) & ~newton_only & (count == previous_count)
        candidate = torch.where(done, tau, torch.where(use_exact, exact, newton))
        c1, c2, c_count = _support_stats(z, candidate, r)
        # Done: the exact candidate kept its support (so it is the root); or a Newton
        # candidate seems past the root, which only rounding at the root can do; or the
        # mass at the candidate is 1 up to rounding.
        done = (
            done
            | (use_exact & (c_count == count))
            | (~use_exact & (c2 < 1.0))
            | ((c2 - 1.0).abs() <= mass_tolerance)
        )
        moved = done | (c2 >= 1.0)  # the candidate is still at or below the root
        previous_count = torch.where(moved, count, previous_count)
        tau = torch.where(moved, candidate, tau)
        if bool(done.all()):
            break
        s1 = torch.where(moved, c1, s1)
        s2 = torch.where(moved, c2, s2)
        count = torch.where(moved, c_count, count)
        newton_only = ~moved
    z.sub_(tau).clamp_min_(0.0).square_()
    if valid is not None:
        out.masked_fill_(~valid, 0.0)


def entmax15_rows_backward(p, g, grad_out, s):
    """Jacobian diag(s) - s s^T / sum(s) with s = p^(2 - alpha) = sqrt(p)."""
    # p / sqrt(max(p, tiny)): exactly 0 off the support, and avoids sqrt(0), which is
    # several times slower than sqrt of a positive number.
    torch.clamp_min(p, torch.finfo(p.dtype).tiny, out=s).rsqrt_().mul_(p)
    sparse_map_backward(g, s, grad_out)


class Entmax15Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dim):
        return output_only_forward(ctx, scores, dim, entmax15_rows, block_scale=WIDE_BLOCK_SCALE)

    @staticmethod
    def backward(ctx, grad):
        return output_only_backward(ctx, grad, entmax15_rows_backward), None


def entmax15(scores, dim=-1):
    """1.5-entmax along `dim` (alpha-entmax with alpha = 1.5, exact threshold).

    -inf scores get weight and gradient exactly 0; an all -inf row gives zeros.
    float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
    """
    check_scores(scores, dim, "entmax15")
    return Entmax15Function.apply(scores, dim)
