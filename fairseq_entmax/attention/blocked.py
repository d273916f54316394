"""scaled_dot_product_attention in blocks of queries, with the probabilities recomputed in the
backward from a few numbers per query row (fairseq_entmax.normalizers.recomputable).

A block is a range of queries of a chunk of the batch and of the heads (every head where they
fit), against the keys that the mask leaves visible to at least one of its queries: with a
causal mask, a sliding window or padding, the keys it hides from the whole block are never
computed. Its scores are (batch chunk x heads, block queries, visible keys), at most about
BLOCK_ELEMENTS elements, and are freed once the block's output (forward) or gradients
(backward) are written. For a sparse map, the forward's P.V and the backward run only over the
key blocks in which some weight of the block is nonzero (its support map, docs/attention.md):
at long context a block holds one head, whose support is its own.
"""

import math
import numbers

import torch

from fairseq_entmax.names import NORMALIZER_NAMES
from fairseq_entmax.normalizers import AttentionNormalizer, build_normalizer
from fairseq_entmax.normalizers._common import compute_dtype
from fairseq_entmax.normalizers.recomputable import TopKRows, recomputable_rows
from fairseq_entmax.normalizers.topk import gather_chunks

# Score elements of one block: on the CPU small enough that a block and the normalizer's
# scratch stay within the caches, large enough for the matrix products to run at full speed
# (benchmarks/attention.py measures the choice); on an accelerator, where each operation is a
# kernel launch, larger.
BLOCK_ELEMENTS = {"cpu": 1 << 20, "accelerator": 1 << 24}
# A call whose probabilities hold at most this many elements per element of query, key and
# value is computed materialized (the scores, the normalizer's own autograd, the values), which
# is faster at those sizes than recomputing in the backward (benchmarks/RESULTS.md, "Blocked
# attention"), while its memory stays a few times that of the inputs.
MATERIALIZED_PER_INPUT_ELEMENT = 1
# The fewest queries a block takes by default before its batch, then its heads, are split
# instead: a product of fewer queries reads every key for little work (at 16,384 keys, blocks
# of 8 queries of 8 heads made the blocked attention 2-3 times slower; benchmarks/RESULTS.md).
MIN_BLOCK_QUERIES = 64
# The support map's key blocks: a sparse map's block of queries records which blocks of this
# many keys hold a nonzero weight, and its P.V and backward run over those keys only.
SUPPORT_KEYS = 64
# Above this fraction of a block's visible keys in the support, gathering them costs more than
# it saves: the block runs over all of them.
MOST_SUPPORT_GATHERED = 0.75
# Where every key block is some row's candidate, the threshold search runs on each row's own
# candidate blocks gathered, when none has more than this fraction of the keys.
MOST_ROW_CANDIDATES = 0.5


class _Mask:
    """attn_mask as a 4-D view (batch or 1, heads or 1, queries or 1, keys or 1), with the
    batch dims flattened, and its gradient back in the mask's own shape."""

    def __init__(self, mask, batch_shape, batch):
        self.shape = mask.shape
        self.dtype = mask.dtype
        self.is_bool = mask.dtype == torch.bool
        batch_dims = len(batch_shape)
        full = mask.reshape((1,) * (batch_dims + 3 - mask.dim()) + tuple(mask.shape))
        self.full_shape = full.shape
        if all(size == 1 for size in full.shape[:batch_dims]):
            self.four = full.reshape((1,) + tuple(full.shape[batch_dims:]))
            self.expanded_shape = full.shape
        else:
            self.expanded_shape = tuple(batch_shape) + tuple(full.shape[batch_dims:])
            self.four = full.expand(self.expanded_shape).reshape((batch,) + tuple(full.shape[batch_dims:]))

    def _slices(self, b0, b1, h0, h1, q0, q1, k0, k1):
        sizes = self.four.shape
        return (
            slice(b0, b1) if sizes[0] > 1 else slice(None),
            slice(h0, h1) if sizes[1] > 1 else slice(None),
            slice(q0, q1) if sizes[2] > 1 else slice(None),
            slice(k0, k1) if sizes[3] > 1 else slice(None),
        )

    def block(self, b0, b1, h0, h1, q0, q1, k0, k1):
        """The mask of a block, broadcastable to its scores (batch, heads, queries, keys)."""
        return self.four[self._slices(b0, b1, h0, h1, q0, q1, k0, k1)]

    def add_gradient(self, gradient, scores_gradient, b0, b1, h0, h1, q0, q1, k0, k1):
        """Add a block's score gradient into the mask's (4-D) gradient."""
        target = gradient[self._slices(b0, b1, h0, h1, q0, q1, k0, k1)]
        target.add_(scores_gradient.sum_to_size(target.shape))

    def gradient_of_mask(self, gradient):
        """The 4-D gradient in the shape and dtype of the mask given."""
        shaped = gradient.reshape(self.expanded_shape).sum_to_size(self.full_shape)
        return shaped.reshape(self.shape).to(self.dtype)

    def visible_key_ranges(self, query_blocks, keys):
        """For each query block (q0, q1), the range (k0, k1) of the keys that some query of it
        sees ((0, 0) where none does). A float mask hides where it is -inf."""
        visible = self.four if self.is_bool else self.four != float("-inf")
        visible = visible.any(dim=1).any(dim=0)  # (queries or 1, keys or 1)
        if visible.shape[0] == 1:
            per_block = visible.expand(len(query_blocks), visible.shape[1])
        else:
            size = query_blocks[0][1] - query_blocks[0][0]
            padded = visible.new_zeros((len(query_blocks) * size, visible.shape[1]))
            padded[: visible.shape[0]] = visible
            per_block = padded.view(len(query_blocks), size, -1).any(dim=1)
        seen = per_block.any(dim=1)
        if per_block.shape[1] == 1:
            return [(0, keys) if any_seen else (0, 0) for any_seen in seen.tolist()]
        as_int = per_block.to(torch.uint8)
        first = as_int.argmax(dim=1)
        last = keys - as_int.flip(1).argmax(dim=1)
        return [
            (k0, k1) if any_seen else (0, 0) for any_seen, k0, k1 in zip(seen.tolist(), first.tolist(), last.tolist())
        ]


class _Spec:
    """What one call computes, fixed before the forward and reused by the backward: the shapes,
    the row map, the blocks (b0, b1, h0, h1, q0, q1, k0, k1: ranges of the batch, of the heads
    (whole groups of heads that share a key head), of the queries and of the keys) and the
    dropout's seed."""

    def __init__(self, batch_shape, heads, kv_heads, queries, keys, rows, mask, causal, scale, dropout_p, blocks):
        self.batch_shape = batch_shape
        self.batch = math.prod(batch_shape)
        self.heads, self.kv_heads = heads, kv_heads
        self.groups = heads // kv_heads
        self.queries, self.keys = queries, keys
        self.rows, self.mask, self.causal = rows, mask, causal
        self.scale = scale
        self.dropout_p = dropout_p
        self.blocks = blocks
        # The support map, as the runs of consecutive key blocks with a nonzero weight of each
        # block (key ranges), filled in by the forward. A dense map or dropout (whose keep mask
        # is drawn over all visible keys) runs each block over all of them.
        self.maps_support = rows.is_sparse and dropout_p == 0
        self.support = None
        # Top-k's blocks keep each row's k kept keys instead (_KEPT_KEYS in support), where the
        # mask needs no gradient (set by the forward): the keys' rows in the keys and values
        # flattened to (batch x kv heads x keys, dim), and their weights, each (batch, heads,
        # queries, k). Whole tensors, not one per block: small tensors that outlive their
        # block would scatter the allocator's heap between the blocks' scores.
        self.gathers_kept_keys = isinstance(rows, TopKRows) and dropout_p == 0
        self.kept_rows = self.kept_weights = None
        # Drawn from torch's default generator, so that torch.manual_seed fixes the dropout; each
        # block's keep mask comes from its own generator, seeded from it, forward and backward.
        self.seed = int(torch.randint(0, 2**62, ())) if dropout_p > 0 and blocks else None

    def dropout_keep(self, index, like):
        """The scaled keep mask (0 or 1 / (1 - p)) of block `index`, shaped like `like`."""
        generator = torch.Generator(device=like.device)
        generator.manual_seed(self.seed + index)
        keep = torch.rand(like.shape, generator=generator, device=like.device, dtype=like.dtype)
        return keep.ge_(self.dropout_p).mul_(1.0 / (1.0 - self.dropout_p))

    def sparse_forward(self, scores, params, k0, k1):
        """The forward of a sparse block on the CPU, over its candidate keys, with its support
        map. From one pass over the scores, the maxima of each row's blocks of SUPPORT_KEYS
        keys: their threshold bounds the row's from below (rows.may_weigh), since a row's
        threshold is at least that of any subset of its scores. The normalizer searches the
        candidate blocks, whose maximum reaches that bound in some row, or the whole block
        where they are most of it; the blocks whose maximum reaches the rows' own thresholds
        then hold the support.

        Returns:
            (the rows' statistics, the support's key ranges, the weights (.., queries, keys
            held), the key ranges the weights hold, one after the other), or None where the
            block is normalized whole without a support map: a dense map, dropout, an
            accelerator, or a row with a NaN or +inf score.
        """
        keys = k1 - k0
        if not self.maps_support or keys <= SUPPORT_KEYS or scores.device.type != "cpu":
            return None
        x = scores.view(-1, keys)
        whole = keys - keys % SUPPORT_KEYS
        block_max = x[:, :whole].view(x.shape[0], -1, SUPPORT_KEYS).amax(dim=-1)
        if whole < keys:
            block_max = torch.cat([block_max, x[:, whole:].amax(dim=-1, keepdim=True)], dim=-1)
        m = block_max.amax(dim=-1, keepdim=True)
        if bool(((m != m) | (m == float("inf"))).any()):
            return None
        seen = m > float("-inf")  # fully masked rows have no weight anywhere

        def row_may_weigh(stats):  # per row and key block: whether the row may give it weight
            return self.rows.may_weigh(block_max, stats, params).logical_and_(seen)

        def may_weigh(stats):  # per key block: whether some row may give it weight
            return row_may_weigh(stats).any(dim=0)

        bound = row_may_weigh(self.rows.forward(block_max.clone(), params)[1])
        candidate = bound.any(dim=0)
        candidates = _runs(candidate, k0, k1)
        if not candidates:
            return None
        if candidates == [(k0, k1)]:
            stats = _statistics_of_row_candidates(self.rows, x, bound, params)
            if stats is None:
                p, stats = self.rows.forward(x, params)
            else:
                p = self.rows.recompute(x, stats, params)
            return stats, _runs(may_weigh(stats), k0, k1), p.view_as(scores), candidates
        held = torch.cat([scores[:, :, r0 - k0 : r1 - k0] for r0, r1 in candidates], dim=-1)
        p, stats = self.rows.forward(held.view(x.shape[0], -1), params)
        # The weights are the candidates' only: a block the two searches' rounding would let
        # in beside them has none.
        return stats, _runs(may_weigh(stats).logical_and_(candidate), k0, k1), p.view_as(held), candidates

    def keep_keys(self, scores, params, b0, b1, h0, h1, q0, q1, k0):
        """Store the top-k forward of a block as its kept keys (kept_rows, kept_weights).

        Returns:
            The block's weights (rows, k) and their rows (rows, k), or None where the block is
            normalized over its key ranges instead (TopKRows.kept_keys).
        """
        if not self.gathers_kept_keys or scores.device.type != "cpu":
            return None
        found = self.rows.kept_keys(scores.view(-1, scores.shape[-1]), params)
        if found is None:
            return None
        columns, weights = found
        kv_heads = torch.arange(h0, h1, device=scores.device) // self.groups
        first = (torch.arange(b0, b1, device=scores.device)[:, None] * self.kv_heads + kv_heads) * self.keys + k0
        rows = columns.add_(first.repeat_interleave(q1 - q0).view(-1, 1))
        if self.kept_rows is None:
            shape = (self.batch, self.heads, self.queries, rows.shape[-1])
            self.kept_rows = rows.new_empty(shape)
            self.kept_weights = weights.new_empty(shape)
        self.kept_rows[b0:b1, h0:h1, q0:q1] = rows.view(b1 - b0, h1 - h0, q1 - q0, -1)
        self.kept_weights[b0:b1, h0:h1, q0:q1] = weights.view(b1 - b0, h1 - h0, q1 - q0, -1)
        return weights, rows

    def runs_scores(self, query, key, value, b0, b1, h0, h1, q0, q1, runs):
        """block_scores over the keys of `runs` (key ranges of the block), concatenated: (scaled
        queries, keys, scores, values (batch x kv heads, keys, value dim))."""
        parts = [self.block_scores(query, key, b0, b1, h0, h1, q0, q1, r0, r1) for r0, r1 in runs]
        g0, g1 = h0 // self.groups, h1 // self.groups
        values = [value[b0:b1, g0:g1, r0:r1].reshape(-1, r1 - r0, value.shape[-1]) for r0, r1 in runs]
        if len(parts) == 1:
            return (*parts[0], values[0])
        return (
            parts[0][0],
            torch.cat([k for _, k, _ in parts], dim=1),
            torch.cat([scores for _, _, scores in parts], dim=-1),
            torch.cat(values, dim=1),
        )

    def block_scores(self, query, key, b0, b1, h0, h1, q0, q1, k0, k1):
        """(scaled queries (batch x kv heads, groups x queries, dim), keys, masked scores) of a
        block; query (batch, heads, queries, dim) and key (batch, kv heads, keys, dim) in the
        compute dtype, contiguous."""
        batch, queries, keys = b1 - b0, q1 - q0, k1 - k0
        g0, g1 = h0 // self.groups, h1 // self.groups
        q = (query[b0:b1, h0:h1, q0:q1] * self.scale).view(batch * (g1 - g0), self.groups * queries, -1)
        k = key[b0:b1, g0:g1, k0:k1].reshape(batch * (g1 - g0), keys, -1)
        scores = torch.bmm(q, k.transpose(1, 2))
        per_head = scores.view(batch, h1 - h0, queries, keys)
        if self.mask is not None:
            mask = self.mask.block(b0, b1, h0, h1, q0, q1, k0, k1)
            if self.mask.is_bool:
                per_head.masked_fill_(~mask, float("-inf"))
            else:
                per_head.add_(mask)
        if self.causal and k1 - 1 > q0:
            # Only the keys after the block's first query can be hidden from one of its queries.
            first = max(k0, q0 + 1)
            hidden = torch.arange(first, k1, device=scores.device) > torch.arange(q0, q1, device=scores.device)[:, None]
            per_head[..., first - k0 :].masked_fill_(hidden, float("-inf"))
        return q, k, scores


# A top-k block's entry in _Spec.support: the block keeps each row's k keys (kept_rows).
_KEPT_KEYS = "kept keys"


def _gather(flat, rows):
    """The rows (rows, k) of flat (batch x kv heads x keys, dim): (rows, k, dim)."""
    return flat.index_select(0, rows.view(-1)).view(*rows.shape, flat.shape[-1])


def _weighted_sum(weights, kept):
    """sum_i weights[:, i] kept[:, i] of weights (rows, k) and kept (rows, k, dim): (rows, dim).
    Not torch.bmm, which on the CPU loops over its (rows) products of a k-vector, each with the
    cost of an operator call."""
    return kept.mul_(weights.unsqueeze(-1)).sum(dim=1)


def _add_at(total, rows, per_key):
    """Add per_key (rows, k, dim) into total (batch, kv heads, keys, dim) at its rows (rows, k)."""
    total.view(-1, total.shape[-1]).index_add_(0, rows.view(-1), per_key.view(-1, total.shape[-1]))


def _kept_keys_backward(spec, q4, k4, v4, grad4, dq, dk, dv, block):
    """Add a top-k block's gradients into dq, dk and dv (None where not needed), from its kept
    keys alone: the weights' VJP is softmax's over the k kept keys."""
    b0, b1, h0, h1, q0, q1, _, _ = block
    rows = spec.kept_rows[b0:b1, h0:h1, q0:q1].reshape(-1, spec.kept_rows.shape[-1])
    weights = spec.kept_weights[b0:b1, h0:h1, q0:q1].reshape(rows.shape)
    grad = grad4[b0:b1, h0:h1, q0:q1].to(weights.dtype).reshape(-1, 1, grad4.shape[-1])
    if dv is not None:
        _add_at(dv, rows, weights.unsqueeze(-1) * grad)
    if dq is None and dk is None:
        return
    g_weights = _gather(v4.view(-1, v4.shape[-1]), rows).mul_(grad).sum(dim=-1)
    g_scores, _ = spec.rows.backward(weights, g_weights, None, False)
    if dq is not None:
        block_dq = dq[b0:b1, h0:h1, q0:q1]
        kept_keys = _gather(k4.view(-1, k4.shape[-1]), rows)
        block_dq.copy_(_weighted_sum(g_scores, kept_keys).mul_(spec.scale).view_as(block_dq))
    if dk is not None:
        scaled_queries = q4[b0:b1, h0:h1, q0:q1].reshape(-1, 1, q4.shape[-1]) * spec.scale
        _add_at(dk, rows, g_scores.unsqueeze(-1) * scaled_queries)


def _statistics_of_row_candidates(rows, x, candidate, params):
    """The statistics of the rows of x (rows, keys) from each row's own candidate key blocks
    (candidate: (rows, key blocks) bool, the last block possibly partial) gathered, the others
    -inf: the same threshold, maximum and sum, since the keys left out have no weight. None
    where some row's candidates are more than MOST_ROW_CANDIDATES of the keys, as the search
    over the whole rows then costs less than the gathering, or for a map whose statistics
    depend on keys without weight (top-k's cut)."""
    if not rows.stats_from_candidates:
        return None
    keys = x.shape[1]
    whole_blocks = keys // SUPPORT_KEYS
    chosen = candidate[:, :whole_blocks]
    most = int(chosen.sum(dim=-1).max())
    if most * SUPPORT_KEYS > MOST_ROW_CANDIDATES * keys:
        return None
    blocks = torch.topk(chosen.to(x.dtype), most, dim=-1, sorted=False)
    gathered = gather_chunks(x, blocks.indices, SUPPORT_KEYS)
    # A row with fewer candidates fills up with other blocks: left out.
    padding = (blocks.values == 0).unsqueeze(-1)
    gathered[:, : most * SUPPORT_KEYS].view(x.shape[0], most, SUPPORT_KEYS).masked_fill_(padding, float("-inf"))
    return rows.forward(gathered, params)[1]


def _runs(kept, k0, k1):
    """The key ranges of the SUPPORT_KEYS blocks of keys k0..k1 flagged in `kept` (a bool
    tensor), consecutive blocks joined, or [(k0, k1)] where they hold most of the keys."""
    kept = kept.tolist()
    if sum(kept) * SUPPORT_KEYS > MOST_SUPPORT_GATHERED * (k1 - k0):
        return [(k0, k1)]
    runs = []
    for index, nonzero in enumerate(kept):
        if not nonzero:
            continue
        start, end = k0 + index * SUPPORT_KEYS, min(k1, k0 + (index + 1) * SUPPORT_KEYS)
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
    return runs


def _columns(runs, held):
    """Where each key range of `runs` starts among the columns of weights that hold the key
    ranges `held` one after the other (each run lies within one of them)."""
    starts, column = [], 0
    for h0, h1 in held:
        starts.append((h0, h1, column))
        column += h1 - h0
    return [next(column + r0 - h0 for h0, h1, column in starts if h0 <= r0 < h1) for r0, _ in runs]


def _flat_inputs(spec, query, key, value, work_dtype):
    """query (batch, heads, queries, dim) and key, value (batch, kv heads, keys, dim), contiguous
    (the blocks' views rely on it), in the compute dtype."""
    query = query.reshape(spec.batch, spec.heads, spec.queries, query.shape[-1]).to(work_dtype).contiguous()
    key = key.reshape(spec.batch, spec.kv_heads, spec.keys, key.shape[-1]).to(work_dtype).contiguous()
    value = value.reshape(spec.batch, spec.kv_heads, spec.keys, value.shape[-1]).to(work_dtype).contiguous()
    return query, key, value


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, attn_mask, alpha, spec):
        work_dtype = compute_dtype(query.dtype)
        q4, k4, v4 = _flat_inputs(spec, query, key, value, work_dtype)
        out = torch.zeros(spec.batch, spec.heads, spec.queries, value.shape[-1], dtype=work_dtype, device=query.device)
        stats = None
        spec.support = []  # anew where the forward runs again (activation checkpointing)
        spec.gathers_kept_keys = spec.gathers_kept_keys and not ctx.needs_input_grad[3]
        spec.kept_rows = spec.kept_weights = None
        for index, (b0, b1, h0, h1, q0, q1, k0, k1) in enumerate(spec.blocks):
            _, _, scores = spec.block_scores(q4, k4, b0, b1, h0, h1, q0, q1, k0, k1)
            params = spec.rows.block_params(scores.view(b1 - b0, h1 - h0, q1 - q0, k1 - k0), h0)
            kept = spec.keep_keys(scores, params, b0, b1, h0, h1, q0, q1, k0)
            if kept is not None:
                spec.support.append(_KEPT_KEYS)
                weights, rows = kept
                block_out = _weighted_sum(weights, _gather(v4.view(-1, v4.shape[-1]), rows))
                out[b0:b1, h0:h1, q0:q1] = block_out.view(b1 - b0, h1 - h0, q1 - q0, -1)
                continue
            found = spec.sparse_forward(scores, params, k0, k1)
            if found is None:
                p, block_stats = spec.rows.forward(scores.view(-1, k1 - k0), params)
                p = p.view_as(scores)
                if spec.dropout_p > 0:
                    p = p.mul_(spec.dropout_keep(index, p))
                runs = held = [(k0, k1)]
            else:
                block_stats, runs, p, held = found
            if stats is None:
                stats = [scores.new_empty((spec.batch, spec.heads, spec.queries)) for _ in block_stats]
            for saved, value_of_rows in zip(stats, block_stats):
                saved[b0:b1, h0:h1, q0:q1] = value_of_rows.view(b1 - b0, h1 - h0, q1 - q0)
            spec.support.append(runs)
            block_out = None
            for (r0, r1), column in zip(runs, _columns(runs, held)):
                v = v4[b0:b1, h0 // spec.groups : h1 // spec.groups, r0:r1].reshape(-1, r1 - r0, v4.shape[-1])
                weights = p[:, :, column : column + r1 - r0]
                block_out = torch.bmm(weights, v) if block_out is None else block_out.baddbmm_(weights, v)
            if block_out is None:  # no key with weight: fully masked rows
                block_out = p.new_zeros(p.shape[0], p.shape[1], v4.shape[-1])
            out[b0:b1, h0:h1, q0:q1] = block_out.view(b1 - b0, h1 - h0, q1 - q0, -1)
        ctx.spec = spec
        ctx.save_for_backward(query, key, value, attn_mask, alpha, *(stats or ()))
        return out.view(*spec.batch_shape, spec.heads, spec.queries, -1).to(query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        spec = ctx.spec
        query, key, value, attn_mask, alpha, *stats = ctx.saved_tensors
        need_q, need_k, need_v, need_mask, need_alpha, _ = ctx.needs_input_grad
        work_dtype = compute_dtype(query.dtype)
        q4, k4, v4 = _flat_inputs(spec, query, key, value, work_dtype)
        grad4 = grad_out.reshape(spec.batch, spec.heads, spec.queries, -1)
        dq = torch.zeros_like(q4) if need_q else None
        dk = torch.zeros_like(k4) if need_k else None
        dv = torch.zeros_like(v4) if need_v else None
        dmask = torch.zeros(spec.mask.four.shape, dtype=work_dtype, device=query.device) if need_mask else None
        dalpha = torch.zeros(spec.heads, dtype=work_dtype, device=query.device) if need_alpha else None
        for index, ((b0, b1, h0, h1, q0, q1, _, _), runs) in enumerate(zip(spec.blocks, spec.support)):
            batch, heads, queries = b1 - b0, h1 - h0, q1 - q0
            if runs is _KEPT_KEYS:
                _kept_keys_backward(spec, q4, k4, v4, grad4, dq, dk, dv, spec.blocks[index])
                continue
            q, k, scores, v = spec.runs_scores(q4, k4, v4, b0, b1, h0, h1, q0, q1, runs)
            keys = scores.shape[-1]
            params = spec.rows.block_params(scores.view(batch, heads, queries, keys), h0)
            block_stats = [saved[b0:b1, h0:h1, q0:q1].reshape(-1, 1) for saved in stats]
            p = spec.rows.recompute(scores.view(-1, keys), block_stats, params)
            g_out = grad4[b0:b1, h0:h1, q0:q1].to(work_dtype).reshape(q.shape[0], spec.groups * queries, -1)
            keep = spec.dropout_keep(index, scores) if spec.dropout_p > 0 else None
            if need_v:
                dropped = p.view_as(scores) if keep is None else p.view_as(scores) * keep
                _add_over_runs(dv, torch.bmm(dropped.transpose(1, 2), g_out), b0, b1, h0, h1, spec.groups, runs)
            if not (need_q or need_k or need_mask or need_alpha):
                continue
            g_p = torch.bmm(g_out, v.transpose(1, 2))
            if keep is not None:
                g_p.mul_(keep)
            g_scores, alpha_rows = spec.rows.backward(p, g_p.view(-1, keys), params, need_alpha)
            g_scores = g_scores.view_as(scores)
            if need_alpha:
                dalpha[h0:h1] += alpha_rows.view(batch, heads, queries).sum(dim=(0, 2))
            if need_mask:
                per_head = g_scores.view(batch, heads, queries, keys)
                start = 0
                for r0, r1 in runs:
                    run_gradient = per_head[..., start : start + r1 - r0]
                    spec.mask.add_gradient(dmask, run_gradient, b0, b1, h0, h1, q0, q1, r0, r1)
                    start += r1 - r0
            if need_q:
                dq[b0:b1, h0:h1, q0:q1] = torch.bmm(g_scores, k).mul_(spec.scale).view(batch, heads, queries, -1)
            if need_k:
                _add_over_runs(dk, torch.bmm(g_scores.transpose(1, 2), q), b0, b1, h0, h1, spec.groups, runs)
        return (
            None if dq is None else dq.view(query.shape).to(query.dtype),
            None if dk is None else dk.view(key.shape).to(key.dtype),
            None if dv is None else dv.view(value.shape).to(value.dtype),
            None if dmask is None else spec.mask.gradient_of_mask(dmask),
            None if dalpha is None else dalpha.to(alpha.dtype),
            None,
        )


def _add_over_runs(total, gradient, b0, b1, h0, h1, groups, runs):
    """Add a block's gradient of its keys (batch x kv heads, keys of the runs, dim) into the
    keys' or values' gradient (batch, kv heads, keys, dim) at the runs' key ranges."""
    g0, g1 = h0 // groups, h1 // groups
    per_head = gradient.view(b1 - b0, g1 - g0, -1, total.shape[-1])
    start = 0
    for r0, r1 in runs:
        total[b0:b1, g0:g1, r0:r1] += per_head[:, :, start : start + r1 - r0]
        start += r1 - r0


def _materialized_attention(spec, module, query, key, value):
    """The attention through autograd in one block, for a call small enough that holding its
    probabilities costs less than recomputing them."""
    q4, k4, v4 = _flat_inputs(spec, query, key, value, compute_dtype(query.dtype))
    scores = spec.block_scores(q4, k4, 0, spec.batch, 0, spec.heads, 0, spec.queries, 0, spec.keys)[2]
    weights = module(scores.view(spec.batch * spec.heads, spec.queries, spec.keys)).view_as(scores)
    if spec.dropout_p > 0:
        weights = torch.nn.functional.dropout(weights, spec.dropout_p)
    out = torch.bmm(weights, v4.view(spec.batch * spec.kv_heads, spec.keys, -1))
    return out.view(*spec.batch_shape, spec.heads, spec.queries, -1).to(query.dtype)


def _check_tensors(query, key, value):
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not torch.is_tensor(tensor):
            raise TypeError(f"scaled_dot_product_attention: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(f"scaled_dot_product_attention: {name} must be a floating tensor, got {tensor.dtype}")
        if tensor.dim() < 3:
            raise ValueError(
                f"scaled_dot_product_attention: {name} must have at least 3 dims (..., heads, length, dim), "
                f"got shape {tuple(tensor.shape)}"
            )
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"scaled_dot_product_attention: query, key and value must have one dtype, got "
            f"{query.dtype}, {key.dtype} and {value.dtype}"
        )
    if not (query.device == key.device == value.device):
        raise ValueError(
            f"scaled_dot_product_attention: query, key and value must be on one device, got "
            f"{query.device}, {key.device} and {value.device}"
        )
    shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    if not (query.shape[:-3] == key.shape[:-3] == value.shape[:-3]):
        raise ValueError(f"scaled_dot_product_attention: the batch dims of query, key and value differ: {shapes}")
    if key.shape[-3] != value.shape[-3] or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: key and value must have the same heads and length: {shapes}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"scaled_dot_product_attention: query and key must have the same last dim: {shapes}")


def _check_heads(query, key, enable_gqa):
    heads, kv_heads = query.shape[-3], key.shape[-3]
    if heads == kv_heads:
        return
    if not enable_gqa:
        raise ValueError(
            f"scaled_dot_product_attention: query has {heads} heads and key {kv_heads}; pass enable_gqa=True "
            "for grouped-query attention"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"scaled_dot_product_attention: enable_gqa needs the query's heads ({heads}) to be a multiple of "
            f"the key's ({kv_heads})"
        )


def _check_numbers(dropout_p, scale, block_queries):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale)
    ):
        raise ValueError(f"scaled_dot_product_attention: scale must be a finite number or None, got {scale!r}")
    if block_queries is not None and (
        isinstance(block_queries, bool) or not isinstance(block_queries, numbers.Integral) or block_queries < 1
    ):
        raise ValueError(f"scaled_dot_product_attention: block_queries must be an int >= 1, got {block_queries!r}")


def _check_mask(attn_mask, is_causal, target_shape):
    if attn_mask is None:
        return
    if is_causal:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal=True, not both")
    if not torch.is_tensor(attn_mask):
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be a tensor, got {type(attn_mask).__name__}")
    if not (attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
        raise TypeError(
            f"scaled_dot_product_attention: attn_mask must be boolean (True: attend) or floating (added to the "
            f"scores), got {attn_mask.dtype}"
        )
    fits = attn_mask.dim() <= len(target_shape) and all(
        size in (1, target) for size, target in zip(reversed(attn_mask.shape), reversed(target_shape))
    )
    if not fits:
        raise ValueError(
            f"scaled_dot_product_attention: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
            f"the scores' shape {tuple(target_shape)}"
        )


def _normalizer_module(normalizer, heads, options):
    if isinstance(normalizer, AttentionNormalizer):
        if options:
            raise ValueError(
                f"scaled_dot_product_attention: options {sorted(options)} are for a normalizer given by name; "
                "a normalizer module carries its own"
            )
        if normalizer.num_heads != heads:
            raise ValueError(
                f"scaled_dot_product_attention: the normalizer is built for {normalizer.num_heads} heads, "
                f"the query has {heads}"
            )
        return normalizer
    if not isinstance(normalizer, str):
        raise TypeError(
            "scaled_dot_product_attention: normalizer must be a name or a module from build_normalizer, got "
            f"{type(normalizer).__name__}"
        )
    if normalizer == "alpha_entmax":
        raise ValueError(
            "scaled_dot_product_attention: alpha_entmax learns its alphas, which a name cannot hold: pass the "
            "module, e.g. normalizer=build_normalizer('alpha_entmax', num_heads), kept on your model"
        )
    if normalizer not in NORMALIZER_NAMES:
        raise ValueError(
            f"scaled_dot_product_attention: unknown normalizer {normalizer!r}; known normalizers: "
            f"{', '.join(name for name in NORMALIZER_NAMES if name != 'alpha_entmax')} (and a module of alpha_entmax)"
        )
    return build_normalizer(normalizer, heads, **options)


def _blocks(spec_shapes, groups, dim, mask, is_causal, device, block_queries, block_share):
    batch, heads, queries, keys = spec_shapes
    # At most half the query's elements: at short lengths a block's scratch then stays within the
    # size of the inputs, which is what torch's fused attention holds.
    elements = BLOCK_ELEMENTS["cpu" if device.type == "cpu" else "accelerator"]
    # A map's share of them, but no fewer than MIN_BLOCK_QUERIES queries of one head where the
    # whole budget holds them: blocks of fewer queries make slower products.
    elements = max(int(elements * block_share), min(elements, MIN_BLOCK_QUERIES * keys))
    budget = min(elements, max(1 << 16, batch * heads * queries * dim // 2))
    chosen = block_queries is not None
    if not chosen:
        block_queries = min(queries, max(MIN_BLOCK_QUERIES, budget // max(1, batch * heads * keys)))
    # Over the budget, a block takes fewer heads (whole groups that share a key head), and only
    # then fewer queries: a product of few queries reads every key for little work.
    block_heads = min(heads, max(groups, budget // max(1, block_queries * keys) // groups * groups))
    if not chosen and block_heads * block_queries * keys > budget:
        block_queries = min(queries, max(1, budget // max(1, block_heads * keys)))
    block_batch = min(batch, max(1, budget // max(1, block_heads * block_queries * keys)))
    query_blocks = [(q0, min(q0 + block_queries, queries)) for q0 in range(0, queries, block_queries)]
    if not query_blocks or batch == 0:
        return []
    if is_causal:
        key_ranges = [(0, min(keys, q1)) for _, q1 in query_blocks]
    elif mask is not None:
        key_ranges = mask.visible_key_ranges(query_blocks, keys)
    else:
        key_ranges = [(0, keys)] * len(query_blocks)
    return [
        (b0, min(b0 + block_batch, batch), h0, min(h0 + block_heads, heads), q0, q1, k0, k1)
        for (q0, q1), (k0, k1) in zip(query_blocks, key_ranges)
        if k1 > k0
        for b0 in range(0, batch, block_batch)
        for h0 in range(0, heads, block_heads)
    ]


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    normalizer="softmax",
    block_queries=None,
    **normalizer_options,
):
    """torch.nn.functional.scaled_dot_product_attention with any normalizer, in blocks of queries.

    Neither the forward nor the backward holds the (batch x heads, queries, keys) scores: each
    block of queries is normalised and multiplied by the values, and the backward recomputes its
    probabilities from three numbers per query row (docs/attention.md). Calls small enough that
    the scores are within a few times the inputs' size are computed whole (see block_queries).

    Args:
        query: (..., heads, queries, dim).
        key: (..., kv_heads, keys, dim); value: (..., kv_heads, keys, value_dim). The batch dims
            are those of query; kv_heads is heads, or with enable_gqa a divisor of it (each key
            head serves heads / kv_heads consecutive query heads).
        attn_mask: None, a boolean mask (True: attend) or a float mask added to the scores (it
            gets a gradient when it requires one, as T5's position bias does), broadcastable to
            (..., heads, queries, keys).
        dropout_p: the dropout probability on the weights (applied whenever > 0, as torch's
            function does; pass 0.0 in evaluation), replayed exactly in the backward.
        is_causal: query i sees keys 0 to i; not together with attn_mask.
        scale: the scores' scale, default dim ** -0.5.
        enable_gqa: allow kv_heads < heads (grouped-query attention).
        normalizer: "softmax", "sparsemax", "entmax15" or "topk" (with the options of
            build_normalizer, e.g. topk=8), or a normalizer module from build_normalizer, e.g.
            a LearnedAlphaEntmax whose alphas then get their gradient.
        block_queries: the queries per block; by default as many as keep a block's scores
            within BLOCK_ELEMENTS and half the query's size (at least MIN_BLOCK_QUERIES, the
            batch, then the heads, split otherwise). Given, the call runs in blocks whatever its size; by
            default a call whose probabilities hold at most MATERIALIZED_PER_INPUT_ELEMENT
            times the elements of query, key and value is computed in one block through the
            normalizer's own autograd, which is faster at those sizes.
        **normalizer_options: build_normalizer's options for a normalizer given by name.

    Returns:
        (..., heads, queries, value_dim) in query's dtype (half precision is computed in float32
        within each block). A query that sees no key gets zeros; NaN in the inputs propagates.

    Raises:
        TypeError, ValueError: for inputs torch's function refuses, naming the argument, and
            for an unknown normalizer or options that do not fit it.
    """
    _check_tensors(query, key, value)
    _check_heads(query, key, enable_gqa)
    batch_shape = tuple(query.shape[:-3])
    heads, queries, dim = query.shape[-3:]
    keys = key.shape[-2]
    _check_mask(attn_mask, is_causal, batch_shape + (heads, queries, keys))
    _check_numbers(dropout_p, scale, block_queries)
    if scale is None:
        scale = dim**-0.5 if dim else 1.0
    module = _normalizer_module(normalizer, heads, normalizer_options)
    rows, alpha = recomputable_rows(module)
    batch = math.prod(batch_shape)
    mask = None if attn_mask is None else _Mask(attn_mask, batch_shape, batch)
    small = block_queries is None and batch * heads * queries * keys <= MATERIALIZED_PER_INPUT_ELEMENT * (
        query.numel() + key.numel() + value.numel()
    )
    shapes = (batch, heads, queries, keys)
    groups = heads // key.shape[-3]
    blocks = (
        [] if small else _blocks(shapes, groups, dim, mask, is_causal, query.device, block_queries, rows.block_share)
    )
    spec = _Spec(
        batch_shape, heads, key.shape[-3], queries, keys, rows, mask, is_causal, float(scale), float(dropout_p), blocks
    )
    if small:
        return _materialized_attention(spec, module, query, key, value)
    return _BlockedAttention.apply(query, key, value, attn_mask, alpha, spec)
