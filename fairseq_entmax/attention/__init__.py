"""Attention with any normalizer of fairseq_entmax.normalizers that never holds the score matrix.

`scaled_dot_product_attention` takes the arguments of torch's function of that name, plus the
normalizer, and works in blocks of queries: a block's scores are computed, normalised and
multiplied by the values, and only a few numbers per query row are kept for the backward,
which recomputes each block's probabilities from them. docs/attention.md has the algorithm
and the measurements. Like the normalizers, it imports torch only.
"""

from fairseq_entmax.attention.blocked import scaled_dot_product_attention

__all__ = ["scaled_dot_product_attention"]
