"""Criteria for fairseq: the entmax losses of the output distribution.

`fenchel_young_loss` (fenchel_young.py) needs torch only. With fairseq installed, importing this
package (as importing fairseq_entmax does) registers the `entmax_loss` criterion
(entmax_loss.py).
"""

from fairseq_entmax._fairseq_required import fairseq_available
from fairseq_entmax.criterions.fenchel_young import FenchelYoungLoss, check_loss_alpha, fenchel_young_loss

__all__ = ["FenchelYoungLoss", "check_loss_alpha", "fenchel_young_loss"]

if fairseq_available():
    from fairseq_entmax.criterions.entmax_loss import CRITERION_NAME, EntmaxLossCriterion  # noqa: F401

    __all__ += ["CRITERION_NAME", "EntmaxLossCriterion"]
