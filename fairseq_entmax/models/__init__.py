"""The fairseq layer's models: importing this registers adaptively_sparse_transformer and
its architectures with fairseq."""

from fairseq_entmax._fairseq_required import require_fairseq

require_fairseq()

from fairseq_entmax.models.adaptively_sparse_transformer import (  # noqa: E402
    MODEL_NAME,
    AdaptivelySparseTransformerModel,
    attention_modules,
    sparse_attention_modules,
)

__all__ = ["MODEL_NAME", "AdaptivelySparseTransformerModel", "attention_modules", "sparse_attention_modules"]
