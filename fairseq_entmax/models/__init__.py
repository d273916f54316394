"""The fairseq layer's models. fairseq's --user-dir imports this folder's modules: importing
this package loads the whole plugin (fairseq_entmax.plugin), which registers
adaptively_sparse_transformer and its architectures."""

from fairseq_entmax._fairseq_required import require_fairseq

require_fairseq()

from fairseq_entmax import plugin  # noqa: E402, F401 (the model, the criterion and the repairs)
from fairseq_entmax.models.adaptively_sparse_transformer import (  # noqa: E402
    MODEL_NAME,
    AdaptivelySparseTransformerModel,
    attention_modules,
    sparse_attention_modules,
)

__all__ = ["MODEL_NAME", "AdaptivelySparseTransformerModel", "attention_modules", "sparse_attention_modules"]
