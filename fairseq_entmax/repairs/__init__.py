"""The repairs of fairseq that the plugin installs, in one place.

- checkpoint_safety: every checkpoint fairseq reads goes through torch's safe unpickler
  (torch >= 2.6 needs it for fairseq's checkpoints at all), and a refusal ends a command with
  its message and exit status 2;
- evaluation_batches: generation and validation see every sentence (fairseq issue #5036);
- sparse_beam_search: beam search ends every sentence when the output distribution is sparse;
- interrupts: Ctrl-C during training ends the command, also while a checkpoint is written or
  a statistic logged to tensorboard (after it), or a batch prefetched (without aborting in torch).

Each is a patching.Repair: `REPAIR.replaces` lists the fairseq symbols it replaces, its install
checks the fairseq version it was written against, and `uninstall()` undoes it exactly, so that
a test can compare with plain fairseq in one process.
"""

from fairseq_entmax.repairs import checkpoint_safety, evaluation_batches, interrupts, sparse_beam_search
from fairseq_entmax.repairs.patching import FAIRSEQ_VERSION, Repair, Replacement

REPAIRS = (checkpoint_safety.REPAIR, evaluation_batches.REPAIR, sparse_beam_search.REPAIR, interrupts.REPAIR)


def install():
    """Install every repair (each at most once)."""
    for repair in REPAIRS:
        repair.install()


def uninstall():
    """Undo every repair: fairseq as it was before install()."""
    for repair in reversed(REPAIRS):
        repair.uninstall()


__all__ = ["FAIRSEQ_VERSION", "REPAIRS", "Repair", "Replacement", "install", "uninstall"]
