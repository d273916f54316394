"""Making the blocked attention's calls visible to hooks on normalizer modules, for the tests
that read a fairseq model's attention weights where fairseq asks for none."""

import contextlib

import torch

from fairseq_entmax.attention import blocked as blocked_attention
from fairseq_entmax.modules import sparse_multihead_attention


@contextlib.contextmanager
def normalizers_see_blocked_calls():
    """Within it, each call of SparseMultiheadAttention's blocked attention also runs its
    normalizer module on the materialized (batch * heads, queries, keys) scores, which fires the
    module's forward hooks, then runs blocked, whatever its size (so the hooks fire once)."""
    blocked = sparse_multihead_attention.scaled_dot_product_attention

    def materializing(query, key, value, attn_mask=None, *, normalizer, scale, **kwargs):
        with torch.no_grad():
            scores = torch.matmul(query, key.transpose(-1, -2)) * scale
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            elif attn_mask is not None:
                scores = scores + attn_mask
            normalizer(scores.flatten(0, 1).float())
        return blocked(query, key, value, attn_mask, normalizer=normalizer, scale=scale, **kwargs)

    materialized_per_input = blocked_attention.MATERIALIZED_PER_INPUT_ELEMENT
    sparse_multihead_attention.scaled_dot_product_attention = materializing
    blocked_attention.MATERIALIZED_PER_INPUT_ELEMENT = 0
    try:
        yield
    finally:
        sparse_multihead_attention.scaled_dot_product_attention = blocked
        blocked_attention.MATERIALIZED_PER_INPUT_ELEMENT = materialized_per_input
