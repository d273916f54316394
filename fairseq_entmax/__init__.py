"""fairseq-entmax: sparse attention for fairseq's Transformer.

`fairseq_entmax.normalizers` needs only torch. Importing the package with fairseq installed
(as `fairseq-train --user-dir fairseq_entmax` does) also registers the models and the
entmax_loss criterion, lets fairseq load checkpoints with torch's safe (weights_only) unpickler,
makes its evaluation (generation, validation) batch every sentence (see evaluation_batches) and
its beam search handle sparse output distributions (see sparse_beam_search); without fairseq the
package still imports, and fairseq_entmax.modules / fairseq_entmax.models raise an
ImportError that says how to install it.
"""

__version__ = "0.1.0"

from pathlib import Path

from fairseq_entmax import normalizers  # noqa: F401
from fairseq_entmax._fairseq_required import fairseq_available

# This package's directory: what fairseq's --user-dir is given.
USER_DIR = str(Path(__file__).resolve().parent)

if fairseq_available():
    from fairseq_entmax import checkpoint_safety, criterions, evaluation_batches, models, sparse_beam_search  # noqa: F401

    # Three repairs of fairseq: checkpoints load with torch's safe unpickler (torch >= 2.6),
    # evaluation batches keep every sentence (fairseq issue #5036), and beam search ends the
    # sentences whose hypotheses have no continuation of nonzero probability left.
    checkpoint_safety.allow_fairseq_checkpoints()
    evaluation_batches.repair_evaluation_batches()
    sparse_beam_search.repair_beam_search_for_sparse_outputs()
