"""Every sentence evaluated: a repair of fairseq's batching for evaluation.

fairseq 0.12's data_utils.batch_by_size, which FairseqDataset.batch_by_size calls, drops the
last batch when its size is not a multiple of --required-batch-size-multiple (8 by default):

    if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0:
        b = b[:-1]

so fairseq-generate on a 20-sentence test set translates 16, and validation (fairseq-validate,
and fairseq-train's validations) silently leaves sentences out, its loss and BLEU computed on
the rest. Upstream: https://github.com/facebookresearch/fairseq/issues/5036 (not fixed).

The multiple matters for training (speed on tensor cores, fairseq's trainer), not for
evaluation, so this repair makes FairseqDataset.batch_by_size
use a multiple of 1 unless the dataset is the one fairseq's Trainer.get_train_iterator batches:
that method is wrapped to mark the dataset it hands to the task's get_batch_iterator, and
training keeps fairseq's batches exactly (its last, smaller batch dropped as before).
fairseq-interactive and the hub already batch with a multiple of 1; fairseq-entmax-analyze
too.
"""

from fairseq_entmax.repairs.patching import Repair, Replacement

_TRAINING_MARK = "_fairseq_entmax_training_batches"


def mark_training(dataset):
    """Mark a dataset as training data: its batches keep --required-batch-size-multiple.

    Args:
        dataset: a FairseqDataset. A wrapper dataset (fairseq's BaseWrapperDataset) batches
            through the dataset it wraps, so that one is marked too, and so on down.
    """
    from fairseq.data import FairseqDataset

    while isinstance(dataset, FairseqDataset) and not getattr(dataset, _TRAINING_MARK, False):
        setattr(dataset, _TRAINING_MARK, True)
        dataset = getattr(dataset, "dataset", None)


def _multiple_for_training_only(batch_by_size):
    def batch_by_size_keeping_every_sentence(
        self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1
    ):
        if not getattr(self, _TRAINING_MARK, False):
            required_batch_size_multiple = 1
        return batch_by_size(
            self,
            indices,
            max_tokens=max_tokens,
            max_sentences=max_sentences,
            required_batch_size_multiple=required_batch_size_multiple,
        )

    batch_by_size_keeping_every_sentence.__doc__ = batch_by_size.__doc__
    return batch_by_size_keeping_every_sentence


def _marking_training_data(get_train_iterator):
    def get_train_iterator_marking_its_dataset(self, *args, **kwargs):
        task = self.task
        own = vars(task).get("get_batch_iterator")
        get_batch_iterator = task.get_batch_iterator

        def marking(*batch_args, **batch_kwargs):
            mark_training(batch_kwargs["dataset"] if "dataset" in batch_kwargs else batch_args[0])
            return get_batch_iterator(*batch_args, **batch_kwargs)

        task.get_batch_iterator = marking
        try:
            return get_train_iterator(self, *args, **kwargs)
        finally:
            if own is None:
                del task.get_batch_iterator
            else:
                task.get_batch_iterator = own

    get_train_iterator_marking_its_dataset.__doc__ = get_train_iterator.__doc__
    return get_train_iterator_marking_its_dataset


# Only training batches drop a last batch that is not a multiple of --required-batch-size-multiple.
REPAIR = Repair(
    "every sentence evaluated",
    (
        Replacement("fairseq.data.FairseqDataset", "batch_by_size", _multiple_for_training_only),
        Replacement("fairseq.trainer.Trainer", "get_train_iterator", _marking_training_data),
    ),
)
