"""A drop-in for the entmax package (github deep-spin/entmax): `from fairseq_entmax import entmax`
in place of `import entmax`, with the package's names, signatures and semantics, computed by this
project's normalizers (docs/normalizers.md, "Replacing the entmax package").

What differs: thresholds are found to the dtype's precision (the partial-sort hint `k`, `n_iter`
and `ensure_sum_one` are accepted and change nothing); -inf scores, rows of -inf only, half
precision and alpha = 1 give no NaN. Needs torch only.
"""

from fairseq_entmax.entmax.activations import Entmax15, Sparsemax, entmax15, sparsemax
from fairseq_entmax.entmax.losses import (
    Entmax15Loss,
    EntmaxBisectLoss,
    NormmaxBisectLoss,
    SparsemaxBisectLoss,
    SparsemaxLoss,
    entmax15_loss,
    entmax_bisect_loss,
    normmax_bisect_loss,
    sparsemax_bisect_loss,
    sparsemax_loss,
)
from fairseq_entmax.entmax.root_finding import (
    BudgetBisect,
    EntmaxBisect,
    NormmaxBisect,
    SparsemaxBisect,
    budget_bisect,
    entmax_bisect,
    normmax_bisect,
    sparsemax_bisect,
)

# The version of the entmax package whose interface this follows (1.3, and master's
# return_support_size).
__version__ = "1.3"

__all__ = [
    "BudgetBisect",
    "Entmax15",
    "Entmax15Loss",
    "EntmaxBisect",
    "EntmaxBisectLoss",
    "NormmaxBisect",
    "NormmaxBisectLoss",
    "Sparsemax",
    "SparsemaxBisect",
    "SparsemaxBisectLoss",
    "SparsemaxLoss",
    "budget_bisect",
    "entmax15",
    "entmax15_loss",
    "entmax_bisect",
    "entmax_bisect_loss",
    "normmax_bisect",
    "normmax_bisect_loss",
    "sparsemax",
    "sparsemax_bisect",
    "sparsemax_bisect_loss",
    "sparsemax_loss",
]
