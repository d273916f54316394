"""The entmax losses of the output distribution.

`fenchel_young_loss` (fenchel_young.py) needs torch only; the `entmax_loss` criterion
(entmax_loss.py) is fairseq's, registered when the plugin loads (fairseq_entmax.plugin).
"""

from fairseq_entmax.criterions.fenchel_young import FenchelYoungLoss, check_loss_alpha, fenchel_young_loss

__all__ = ["FenchelYoungLoss", "check_loss_alpha", "fenchel_young_loss"]
