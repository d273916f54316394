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
"""
from fairseq_entmax.normalizers._common import sync_free
from fairseq_entmax.normalizers.alpha_entmax import alpha_entmax
from fairseq_entmax.normalizers.entmax15 import entmax15
from fairseq_entmax.normalizers.softmax import softmax
from fairseq_entmax.normalizers.sparsemax import sparsemax
from fairseq_entmax.normalizers.topk import topk_softmax

_REGISTRY = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "alpha_entmax": alpha_entmax,
    "topk": topk_softmax,
}
NORMALIZER_NAMES = tuple(_REGISTRY)


def get_normalizer(name):
    """The normalizer function registered as `name` (one of NORMALIZER_NAMES).

    softmax, sparsemax and entmax15 take (scores, dim=-1); alpha_entmax takes
    (scores, alpha, dim=-1); topk takes (scores, k, dim=-1).
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown normalizer {name!r}; known normalizers: {', '.join(NORMALIZER_NAMES)}"
        ) from None


__all__ = [
    "NORMALIZER_NAMES",
    "alpha_entmax",
    "entmax15",
    "get_normalizer",
    "softmax",
    "sparsemax",
    "sync_free",
    "topk_softmax",
]
