"""The repairs of fairseq (fairseq_entmax.repairs): each names what it replaces, checks the
fairseq version it was written against, and undoes itself exactly, so that fairseq with and
without them can be compared in one process."""

import logging
import sys

import fairseq
import numpy as np
import pytest
from fairseq.data import FairseqDataset

from fairseq_entmax import repairs
from fairseq_entmax.repairs.patching import Repair, Replacement, _resolve

pytestmark = pytest.mark.usefixtures("fairseq_plugin")


@pytest.fixture
def plain_fairseq():
    """fairseq without the repairs for the test; the plugin's state is restored after it."""
    repairs.uninstall()
    try:
        yield
    finally:
        repairs.install()


class Sentences(FairseqDataset):
    """20 sentences of 3 tokens: batches of 8 leave a last batch of 4."""

    def __len__(self):
        return 20

    def num_tokens(self, index):
        return 3

    def num_tokens_vec(self, indices):
        return np.full(len(indices), 3)

    def size(self, index):
        return 3


def batched_sentences():
    batches = Sentences().batch_by_size(np.arange(20), max_sentences=8, required_batch_size_multiple=8)
    return sum(len(batch) for batch in batches)


def current(symbol):
    owner, _, attribute = symbol.rpartition(".")
    return getattr(_resolve(owner), attribute)


def test_each_repair_lists_what_it_replaces_and_puts_it_back(plain_fairseq):
    originals = {repair.name: [current(symbol) for symbol in repair.replaces] for repair in repairs.REPAIRS}
    assert "sys.excepthook" in repairs.checkpoint_safety.REPAIR.replaces
    assert "fairseq.data.FairseqDataset.batch_by_size" in repairs.evaluation_batches.REPAIR.replaces
    repairs.install()
    for repair in repairs.REPAIRS:
        assert repair.installed
        for symbol, original in zip(repair.replaces, originals[repair.name]):
            assert current(symbol) is not original, symbol
    repairs.install()  # a second install changes nothing
    repairs.uninstall()
    for repair in repairs.REPAIRS:
        assert not repair.installed
        assert [current(symbol) for symbol in repair.replaces] == originals[repair.name], repair.name
    assert sys.excepthook is originals["safe checkpoint loading"][1]
    # The subclass's own generate is back, and the inherited one is not copied onto it.
    from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

    assert "_generate" not in vars(SequenceGeneratorWithAlignment)
    assert vars(SequenceGenerator)["generate"] is originals["beam search over sparse outputs"][1]


def test_plain_fairseq_drops_the_last_evaluation_batch_and_the_repair_keeps_it(plain_fairseq):
    assert batched_sentences() == 16
    repairs.evaluation_batches.REPAIR.install()
    assert batched_sentences() == 20


def test_another_fairseq_version_is_named_in_a_warning(plain_fairseq, monkeypatch, caplog):
    monkeypatch.setattr(fairseq, "__version__", "0.13.0")
    with caplog.at_level(logging.WARNING, logger="fairseq_entmax.repairs.patching"):
        repairs.evaluation_batches.REPAIR.install()
    (record,) = caplog.records
    assert "written against fairseq 0.12.3.1" in record.message and "this is fairseq 0.13.0" in record.message
    assert "fairseq.trainer.Trainer.get_train_iterator" in record.message


def test_a_missing_symbol_stops_the_install_before_anything_is_replaced(plain_fairseq):
    before = FairseqDataset.batch_by_size
    repair = Repair(
        "test",
        (
            Replacement("fairseq.data.FairseqDataset", "batch_by_size", lambda original: None),
            Replacement("fairseq.data.FairseqDataset", "no_such_method", lambda original: None),
        ),
    )
    with pytest.raises(RuntimeError, match="has no fairseq.data.FairseqDataset.no_such_method"):
        repair.install()
    assert FairseqDataset.batch_by_size is before and not repair.installed
