"""The Fenchel-Young losses (fenchel_young.py): the entmax losses of an output layer, which the
`entmax_loss` criterion and the entmax drop-in's losses compute. Needs torch only."""

from fairseq_entmax.losses.fenchel_young import FenchelYoungLoss, check_loss_alpha, fenchel_young_loss

__all__ = ["FenchelYoungLoss", "check_loss_alpha", "fenchel_young_loss"]
