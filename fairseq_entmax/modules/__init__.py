"""The fairseq layer's modules: sparse multi-head attention and the layers built with it."""

from fairseq_entmax._fairseq_required import require_fairseq

require_fairseq()

from fairseq_entmax.modules.sparse_multihead_attention import SparseMultiheadAttention  # noqa: E402
from fairseq_entmax.modules.sparse_transformer_layer import (  # noqa: E402
    SparseTransformerDecoderLayer,
    SparseTransformerEncoderLayer,
)

__all__ = [
    "SparseMultiheadAttention",
    "SparseTransformerDecoderLayer",
    "SparseTransformerEncoderLayer",
]
