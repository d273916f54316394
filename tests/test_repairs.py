"""The repairs of fairseq (fairseq_entmax.repairs): each names what it replaces, checks the
fairseq version it was written against, and undoes itself exactly, so that fairseq with and
without them can be compared in one process."""

import logging
import signal
import subprocess
import sys

import fairseq
import numpy as np
import pytest
import torch
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


# Training interrupted by Ctrl-C (Python's SIGINT handler raises KeyboardInterrupt) while
# fairseq's BufferedIterator collates the next batch in its thread, with torch: each batch takes
# long enough that one is always in hand when the interpreter exits.
INTERRUPTED_WHILE_PREFETCHING = """
import torch
from fairseq.data import iterators
from fairseq_entmax import repairs

repairs.install()


class Batches:
    def __len__(self):
        return 10**6

    def __iter__(self):
        while True:
            yield torch.cat([torch.randn(256, 512) for _ in range(64)]).sum(0)


batches = iterators.BufferedIterator(10, Batches())
for _ in range(3):
    next(batches)
raise KeyboardInterrupt
"""


def ended_by_ctrl_c(tmp_path, source, *args, timeout=120):
    """Run `source` as a program of its own; it must end as Python ends on Ctrl-C: the
    KeyboardInterrupt traceback, then SIGINT. Returns the finished process."""
    program = tmp_path / "program.py"
    program.write_text(source, encoding="utf-8")
    try:
        ended = subprocess.run([sys.executable, program, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the process was still running {timeout} s after Ctrl-C")
    assert ended.returncode == -signal.SIGINT, ended.stderr[-2000:]
    assert ended.stderr.rstrip().endswith("KeyboardInterrupt"), ended.stderr[-2000:]
    return ended


def test_ctrl_c_while_fairseq_prefetches_ends_with_keyboard_interrupt(tmp_path):
    """Plain fairseq aborts there: CPython ends the daemon thread inside torch's C++ frames
    ("terminate called without an active exception", SIGABRT). Repaired, the thread stops before
    the interpreter finalizes and the process ends as Python ends on Ctrl-C: the traceback, then
    SIGINT."""
    ended = ended_by_ctrl_c(tmp_path, INTERRUPTED_WHILE_PREFETCHING)
    assert "terminate called" not in ended.stderr


# Ctrl-C while fairseq logs a statistic to tensorboard: it lands after the scalar is queued
# and before tensorboard's writer thread is woken, which then sleeps until its next flush.
INTERRUPTED_WHILE_LOGGING = """
import os, signal, sys, threading
from fairseq.logging import progress_bar
from fairseq_entmax import repairs

repairs.install()
bar = progress_bar.TensorboardProgressBarWrapper(progress_bar.NoopProgressBar([]), sys.argv[1])
bar.log({"loss": 1.0}, tag="train", step=1)
notify = threading.Condition.notify


def pressing_ctrl_c(condition, n=1):
    threading.Condition.notify = notify
    os.kill(os.getpid(), signal.SIGINT)
    return notify(condition, n)


threading.Condition.notify = pressing_ctrl_c
bar.log({"loss": 0.5}, tag="train", step=2)
print("training goes on")
"""


def test_ctrl_c_while_logging_to_tensorboard_ends_at_once_with_the_log_written(tmp_path):
    """Plain fairseq takes 2 minutes to end there: closing the writer at exit waits for the
    writer thread, asleep until its flush interval (120 s) has passed. Repaired, the log is
    written whole, then Python's KeyboardInterrupt ends the process."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tensorboard"
    ended = ended_by_ctrl_c(tmp_path, INTERRUPTED_WHILE_LOGGING, logs, timeout=60)
    assert "training goes on" not in ended.stdout
    written = EventAccumulator(str(logs / "train"))
    written.Reload()
    assert [(event.step, event.value) for event in written.Scalars("loss")] == [(1, 1.0), (2, 0.5)]


# Ctrl-C while fairseq writes a checkpoint: the third write of the file, which torch's C++ zip
# writer calls, is interrupted.
INTERRUPTED_WHILE_SAVING = """
import os, signal, sys
import torch
from fairseq import checkpoint_utils
from fairseq.file_io import PathManager
from fairseq_entmax import repairs

repairs.install()


class PressingCtrlC:
    def __init__(self, file):
        self.file, self.writes = file, 0

    def write(self, data):
        self.writes += 1
        if self.writes == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.file.close()


open_file = PathManager.open
PathManager.open = lambda path, mode="r", **options: PressingCtrlC(open_file(path, mode, **options))
checkpoint_utils.torch_persistent_save({"weights": torch.arange(10**6.0)}, sys.argv[1])
print("training goes on")
"""


def test_ctrl_c_while_a_checkpoint_is_written_ends_once_it_is_in_place(tmp_path):
    """Plain fairseq retries the save that the interrupt cut short, since torch.save reports
    it as a RuntimeError, and goes on. Repaired, the checkpoint is written whole, then Python's
    KeyboardInterrupt ends the process."""
    checkpoint = tmp_path / "checkpoint_last.pt"
    ended = ended_by_ctrl_c(tmp_path, INTERRUPTED_WHILE_SAVING, checkpoint)
    assert "training goes on" not in ended.stdout
    assert torch.equal(torch.load(checkpoint)["weights"], torch.arange(10**6.0))
    assert sorted(tmp_path.iterdir()) == sorted([checkpoint, tmp_path / "program.py"]), "a .tmp file was left"
