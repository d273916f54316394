"""The `entmax_loss` criterion (entmax_loss.py), fairseq's, registered when the plugin loads
(fairseq_entmax.plugin); the loss it computes is fairseq_entmax.losses'."""
