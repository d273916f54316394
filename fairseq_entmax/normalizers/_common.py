"""Shared machinery of the normalizers: input checks, dtypes, and row-chunked evaluation.

Every map works row by row along one dim. The scores are viewed as a (rows, d) matrix and
processed a block of rows at a time: the temporaries of a block stay in the CPU cache and
are reused from block to block, so the only full-size tensors a call allocates are its
result (and, for backward, the gradient). The iterative threshold searches make several
passes over each block, which is cheap in cache and expensive over the whole tensor.
"""

import contextlib
import numbers

import torch

# Half-precision inputs are normalised in float32 (powers and sums lose too much in 16
# bits) and the result is cast back to the input dtype.
_UPCAST = (torch.float16, torch.bfloat16)

# Elements per block of rows on CPU: 2**18 float32 = 1 MiB per temporary, small enough for
# the temporaries of a block to stay in cache, large enough that the per-operation overhead
# of the few dozen operations per block stays small. On a GPU there is no such cache to fit
# and every operation is a kernel launch: blocks are as large as GPU_BLOCK_ELEMENTS.
BLOCK_ELEMENTS = 1 << 18
GPU_BLOCK_ELEMENTS = 1 << 24
# sparsemax and entmax15 make passes of cheap operations over a block, each followed by
# operations on one value per row whose cost does not shrink with the block; with 2 threads
# the passes are shared between the threads and those operations are not. Blocks
# WIDE_BLOCK_SCALE times larger share that cost among more rows (the measurements are in
# docs/normalizers.md); alpha_entmax's pow-heavy passes, and top-k, are faster at the base size.
WIDE_BLOCK_SCALE = 4

# entmax15 and alpha_entmax stop their Newton search on tau (which lies in [-1, 0]) once
# every row's step is at most this; what is left of the error is of order step^2.
NEWTON_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}

_sync_free_forced = False


@contextlib.contextmanager
def sync_free(enabled=True):
    """Run the normalizers' sync-free path on the CPU too (a context manager).

    The sync-free path makes no host synchronisation: no value is read back to Python, so a
    GPU never waits on it and torch.compile captures it whole. It is a fixed sequence of
    operations: exact thresholds by sorting (sparsemax, entmax15), a fixed number of Newton
    passes frozen per row once converged (alpha_entmax), a full sort for per-row top-k,
    and input checks that fail on the device (torch._assert_async). It always runs on
    GPUs and under torch.compile; on the CPU the early-exit path, which stops as soon as
    every row has converged, is faster and is the default.

    Args:
        enabled: True to force the sync-free path on the CPU inside the block, False to
            leave the choice to the device.
    """
    global _sync_free_forced
    previous, _sync_free_forced = _sync_free_forced, bool(enabled)
    try:
        yield
    finally:
        _sync_free_forced = previous


def uses_sync_free_path(tensor):
    """Whether the normalizers take the sync-free path for `tensor` (see sync_free)."""
    return _sync_free_forced or tensor.device.type != "cpu" or torch.compiler.is_compiling()


def check_values(values, in_range, message):
    """Raise a ValueError unless the bool tensor `in_range` (of values' shape) holds everywhere.

    message has a "{value}" field: the first value out of range, or on the sync-free path,
    which cannot read it back, a device-side assertion (asynchronous on a GPU) that says so.
    """
    if uses_sync_free_path(values):
        torch._assert_async(in_range.all(), message.format(value="a value out of range"))
    elif not bool(in_range.all()):
        raise ValueError(message.format(value=values.detach()[~in_range][0].item()))


def check_scores(scores, dim, name):
    """Raise a clear error unless `scores` is a floating tensor and `dim` one of its dims;
    return dim as a python int (it may be any integer, e.g. a numpy one, as torch allows)."""
    if not torch.is_tensor(scores):
        raise TypeError(f"{name}: scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(
            f"{name}: scores must be a floating point tensor (float16, bfloat16, float32 "
            f"or float64), got {scores.dtype}; convert with scores.float()"
        )
    if scores.dim() == 0:
        raise ValueError(f"{name}: scores must have at least one dimension, got a scalar")
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{name}: dim must be an integer, got {type(dim).__name__} {dim!r}")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(
            f"{name}: dim={dim!r} is not a dim of scores of shape {tuple(scores.shape)} "
            f"(allowed: an int from {-scores.dim()} to {scores.dim() - 1})"
        )
    return int(dim)


def compute_dtype(dtype):
    """The dtype the computation runs in for inputs of `dtype`."""
    return torch.float32 if dtype in _UPCAST else dtype


def as_rows(tensor, dim):
    """`tensor` with `dim` moved last, as a (rows, d) matrix (a view when possible)."""
    moved = tensor.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape


def from_rows(rows, moved_shape, dim):
    """Inverse of as_rows: the (rows, d) matrix back in the layout of the original tensor."""
    return rows.view(moved_shape).movedim(-1, dim)


def as_row_values(per_row, tensor, dim, dtype):
    """Values given per row of `tensor` along `dim` (a tensor of tensor.dim() dims with size 1
    along dim, broadcastable to it), as the (rows, 1) column that matches as_rows(tensor, dim).

    Args:
        per_row: the values, e.g. one alpha per head.
        tensor: the tensor whose rows they belong to.
        dim: the dim the rows run along.
        dtype: the dtype of the result.

    Returns:
        A (rows, 1) tensor.
    """
    moved_shape = tensor.movedim(dim, -1).shape
    return per_row.movedim(dim, -1).expand(*moved_shape[:-1], 1).reshape(-1, 1).to(dtype)


def row_blocks(num_rows, d, device, block_scale=1):
    """(start, stop) of consecutive blocks of rows of about block_scale * BLOCK_ELEMENTS
    elements on CPU, GPU_BLOCK_ELEMENTS on a GPU; a single block under torch.compile,
    whose dynamic shapes would otherwise be specialised on the number of blocks."""
    if torch.compiler.is_compiling():
        return [(0, num_rows)]
    elements = block_scale * BLOCK_ELEMENTS if device.type == "cpu" else GPU_BLOCK_ELEMENTS
    step = max(1, elements // max(d, 1))
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def blocks_and_scratch(rows, num_scratch, block_scale=1):
    """The row blocks of a (num_rows, d) tensor and the scratch buffers a block needs, in the
    compute dtype: num_scratch of them, plus one to compute a block in when rows is
    half precision (cast is then True and the result is copied back in rows' dtype)."""
    num_rows, d = rows.shape
    work_dtype = compute_dtype(rows.dtype)
    blocks = row_blocks(num_rows, d, rows.device, block_scale)
    block_rows = blocks[0][1] - blocks[0][0]
    cast = work_dtype != rows.dtype
    scratch = [torch.empty((block_rows, d), dtype=work_dtype, device=rows.device) for _ in range(num_scratch + cast)]
    return blocks, scratch, cast, work_dtype


def row_maxima(x):
    """The maximum of each row of the (m, d) block x, with fully masked (all -inf) rows at 0.

    Returns:
        ((m, 1) maxima, (m, 1) bool mask of the fully masked rows). A row holding a NaN has a
        NaN maximum and is not masked, so that the NaN reaches its output.
    """
    row_max = x.amax(dim=-1, keepdim=True)
    masked = row_max == float("-inf")
    return row_max.masked_fill_(masked, 0.0), masked


def shift_rows(x, z):
    """Write x minus its row maximum into z (so each row's maximum is 0).

    Rows that are entirely -inf (fully masked) are written as zeros, so that no NaN
    appears; returns the (rows, 1) bool mask of the other rows, or None when all rows are
    valid (checked on the early-exit path only). The caller gives invalid rows zero weight.
    A row holding a NaN has a NaN maximum: it is not masked, so the NaN reaches its output.
    """
    row_max = x.amax(dim=-1, keepdim=True).to(z.dtype)
    masked = row_max == float("-inf")
    all_valid = not uses_sync_free_path(x) and not bool(masked.any())
    if not all_valid:
        row_max.masked_fill_(masked, 0.0)
    if x.dtype == z.dtype:
        torch.sub(x, row_max, out=z)
    else:
        z.copy_(x).sub_(row_max)
    if all_valid:
        return None
    z.masked_fill_(masked, 0.0)
    return ~masked


def map_rows(scores, dim, kernel, row_params=(), num_scratch=1, block_scale=1):
    """Apply `kernel(x_block, out_block, *param_blocks, *scratch)` to blocks of rows.

    x_block is a (m, d) block of the scores in their own dtype; out_block (m, d) in the
    compute dtype receives the result; row_params are (rows, 1) tensors given blockwise;
    scratch are (m, d) buffers of the compute dtype, reused across blocks. Returns the
    result with the shape, layout convention and dtype of `scores`.
    """
    x, moved_shape = as_rows(scores, dim)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    blocks, scratch, cast, _ = blocks_and_scratch(x, num_scratch, block_scale)
    for start, stop in blocks:
        buffers = [buffer[: stop - start] for buffer in scratch]
        out_block = buffers.pop() if cast else out[start:stop]
        kernel(x[start:stop], out_block, *(p[start:stop] for p in row_params), *buffers)
        if cast:
            out[start:stop].copy_(out_block)
    return from_rows(out, moved_shape, dim)


def map_rows_backward(out, grad, dim, kernel, row_params=(), num_scratch=1, row_result=False, block_scale=1):
    """Blockwise VJP: `kernel(p_block, g_block, grad_block, *param_blocks, *scratch)`.

    p_block and g_block come in the compute dtype; grad_block receives the gradient of the
    scores. With row_result, the kernel returns a (m, 1) tensor per block (a gradient per
    row, e.g. for alpha) and this returns (grad_scores, row_values shaped like scores with
    size 1 along dim); otherwise grad_scores.
    """
    p, moved_shape = as_rows(out, dim)
    g, _ = as_rows(grad, dim)
    grad_scores = torch.empty(p.shape, dtype=p.dtype, device=p.device)
    blocks, scratch, cast, work_dtype = blocks_and_scratch(p, num_scratch, block_scale)
    row_values = []
    for start, stop in blocks:
        buffers = [buffer[: stop - start] for buffer in scratch]
        grad_block = buffers.pop() if cast else grad_scores[start:stop]
        result = kernel(
            p[start:stop].to(work_dtype),
            g[start:stop].to(work_dtype),
            grad_block,
            *(param[start:stop] for param in row_params),
            *buffers,
        )
        if cast:
            grad_scores[start:stop].copy_(grad_block)
        if row_result:
            row_values.append(result)
    grad_scores = from_rows(grad_scores, moved_shape, dim)
    if not row_result:
        return grad_scores
    row_shape = tuple(moved_shape[:-1]) + (1,)
    return grad_scores, torch.cat(row_values).view(row_shape).movedim(-1, dim)


class WholeRows:
    """Row operations on an (m, d) block whose entry tensors are (m, d) blocks too."""

    @staticmethod
    def sum(entries):
        """The (m, 1) sums of the rows of entries."""
        return entries.sum(dim=-1, keepdim=True)

    @staticmethod
    def spread(row_values):
        """(m, 1) values, one per row, in the shape of an entry tensor (here: as they are;
        they broadcast)."""
        return row_values


WHOLE_ROWS = WholeRows()


class SelectedEntries:
    """Row operations on the selected entries of an (m, d) block, held as a 1-D tensor in
    row-major order: a sparse map needs only the entries that can be nonzero, often a tenth
    of a block. Selecting them reads their number back, so this is for the CPU's
    early-exit path only.

    Args:
        index: the selected entries' positions in the flattened block, in increasing order.
        counts: the number of selected entries of each row, (m,) integer.
    """

    def __init__(self, index, counts):
        self.index = index
        self.counts = counts
        rows = torch.arange(len(counts), device=counts.device)
        self.rows = torch.repeat_interleave(rows, counts, output_size=len(index))

    def narrowed(self, keep):
        """The SelectedEntries of these where the 1-D bool tensor keep (an entry tensor) holds."""
        kept = keep.nonzero().squeeze(1)
        return SelectedEntries(
            self.index.index_select(0, kept),
            torch.bincount(self.rows.index_select(0, kept), minlength=len(self.counts)),
        )

    def gather(self, block):
        """The selected entries of an (m, d) block, 1-D."""
        return block.reshape(-1).index_select(0, self.index)

    def scatter(self, entries, block):
        """Write entries into their places in the (m, d) block (contiguous), zeros elsewhere."""
        block.zero_().view(-1).index_copy_(0, self.index, entries)

    def sum(self, entries):
        """The (m, 1) sums of each row's selected entries (0 for a row with none)."""
        return torch.segment_reduce(entries, "sum", lengths=self.counts).unsqueeze(1)

    def spread(self, row_values):
        """(m, 1) values, one per row, repeated for each of the row's selected entries."""
        return row_values.reshape(-1).index_select(0, self.rows)


def select_above(values, thresholds, share, scratch):
    """SelectedEntries of the entries of the (m, d) block `values` above their row's
    threshold ((m, 1); +inf selects nothing of a row) when they are at most `share` of the
    block, else None. scratch: a block like values. Reads that number back: early-exit
    path only."""
    # The comparison written as 0/1 in values' dtype: a bool result costs several times more.
    above = torch.gt(values, thresholds, out=scratch)
    counts = above.sum(dim=-1)
    if float(counts.sum()) > share * above.numel():
        return None
    return SelectedEntries(above.bool().view(-1).nonzero().squeeze(1), counts.long())


def sparse_map_backward(g, s, grad_out):
    """VJP of a map whose Jacobian is diag(s) - s s^T / sum(s), written into grad_out.

    Used by sparsemax and entmax (s = p^(2 - alpha) on the support, 0 off it): masked and
    zero-weight entries get gradient exactly 0, and so do rows with sum(s) = 0 (fully
    masked). Returns sum(s * g) / sum(s), which the alpha gradient reuses.
    """
    torch.mul(s, g, out=grad_out)
    skewed_mean = grad_out.sum(dim=-1, keepdim=True) / s.sum(dim=-1, keepdim=True).clamp_min_(1e-30)
    grad_out.addcmul_(s, skewed_mean, value=-1.0)
    return skewed_mean


def output_only_forward(ctx, scores, dim, kernel, num_scratch=1, block_scale=1, row_params=()):
    """Forward of an autograd Function whose row kernel computes the map and whose backward
    needs only the output: saves just that. row_params as in map_rows."""
    ctx.dim = dim
    ctx.block_scale = block_scale
    out = (
        scores.clone()
        if scores.numel() == 0
        else map_rows(scores, dim, kernel, row_params, num_scratch=num_scratch, block_scale=block_scale)
    )
    ctx.save_for_backward(out)
    return out


def output_only_backward(ctx, grad, kernel):
    """Gradient w.r.t. the scores from the saved output, for output_only_forward."""
    (out,) = ctx.saved_tensors
    if out.numel() == 0:
        return torch.zeros_like(out)
    return map_rows_backward(out, grad, ctx.dim, kernel, block_scale=ctx.block_scale)
