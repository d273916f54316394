"""Attention normalizers: maps from scores to probabilities that can be exactly sparse.

Each is a torch.autograd.Function with a hand-written backward that keeps only its output
(and alpha). They import torch only. Conventions shared by all:
- -inf scores (padding and future masks) get weight and gradient exactly 0, and a row that
  is entirely -inf gives all zeros (not NaN);
- float16/bfloat16 inputs are computed in float32 and returned in the input dtype;
- any dim, non-contiguous and empty inputs are accepted;
- a row holding a NaN gives NaN in that row's output (as torch.softmax does), so that an
  overflow is seen (fairseq's fp16 loss scaler reacts to it) instead of hidden as zeros;
- on a GPU, and on the CPU inside `with sync_free():`, they make no host synchronisation
  (see _common.sync_free), and torch.compile(fullgraph=True) captures them whole.

As modules (layers.py), one per attention: `build_normalizer(name, num_heads, **options)`
returns the normalizer an attention layer calls on its scores, owning what it learns (the
per-head alphas of learned alpha-entmax) and its parameters (top-k's k). NormalizerConfig
(config.py) holds those options, their defaults and their checks.
"""

from fairseq_entmax.normalizers._common import sync_free
from fairseq_entmax.normalizers.alpha_entmax import alpha_entmax
from fairseq_entmax.normalizers.config import NormalizerConfig
from fairseq_entmax.normalizers.entmax15 import entmax15
from fairseq_entmax.normalizers.layers import (
    NORMALIZER_NAMES,
    AttentionNormalizer,
    FixedAlphaEntmax,
    LearnedAlphaEntmax,
    TopK,
    build_normalizer,
)
from fairseq_entmax.normalizers.softmax import softmax
from fairseq_entmax.normalizers.sparsemax import sparsemax
from fairseq_entmax.normalizers.topk import topk_softmax

__all__ = [
    "NORMALIZER_NAMES",
    "AttentionNormalizer",
    "FixedAlphaEntmax",
    "LearnedAlphaEntmax",
    "NormalizerConfig",
    "TopK",
    "alpha_entmax",
    "build_normalizer",
    "entmax15",
    "softmax",
    "sparsemax",
    "sync_free",
    "topk_softmax",
]
