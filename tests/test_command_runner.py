"""fairseq_entmax.pipeline.tools.run_logged runs fairseq's console scripts in its own process: the
command's output, exit status and messages are those of the script run as a process, and each
command starts from fairseq's state of a fresh process."""

import logging
import sys

import pytest
import torch

from fairseq_entmax.pipeline.tools import exit_with_status, run_logged
from helpers import USER_DIR, fairseq_command, read_hypotheses, run, run_on_model, train_tiny

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]


def test_generate_in_this_process_prints_what_its_process_prints(trained_model, tmp_path):
    model = trained_model("softmax")
    options = ("--gen-subset", "test", "--beam", "2", "--cpu")
    handlers, threads = list(logging.getLogger().handlers), torch.get_num_threads()
    in_process = run_on_model("fairseq-generate", model, *options)
    assert (logging.getLogger().handlers, torch.get_num_threads()) == (handlers, threads)
    as_process = run_on_model("fairseq-generate", model, *options, process=True)
    hypotheses = read_hypotheses(in_process.stdout)
    assert len(hypotheses) == 40 and hypotheses == read_hypotheses(as_process.stdout)
    # fairseq's log lines go to stdout in its format, as the script's logging.basicConfig puts them.
    assert " | INFO | fairseq_cli.generate | " in in_process.stdout
    log = tmp_path / "generate.log"
    command = [fairseq_command("fairseq-generate"), model.data_bin, "--user-dir", USER_DIR]
    run_logged([*command, "--path", model.checkpoint, *options], log, threads=1)
    assert read_hypotheses(log.read_text(encoding="utf-8")) == hypotheses


def test_a_refused_option_ends_as_in_its_process(tiny_data):
    command = [fairseq_command("fairseq-train"), tiny_data.data_bin, "--user-dir", USER_DIR]
    command += ["--arch", "adaptively_sparse_transformer", "--attention-normalizer", "nope"]
    in_process = run(command, check=False)
    as_process = run(command, check=False, process=True)
    assert in_process.returncode == as_process.returncode == 2
    assert "invalid choice: 'nope'" in in_process.stderr and "invalid choice: 'nope'" in as_process.stderr


def test_each_training_in_this_process_starts_as_a_fresh_process(tiny_data, tmp_path):
    """fairseq-train keeps the best validation loss and the patience count of its run in its
    modules: a second training here, worse than the first, still saves its own best checkpoint
    and is not stopped by the first's patience."""
    train_tiny(tiny_data.data_bin, tmp_path / "first", "--max-update", "30", "--patience", "1")
    second = train_tiny(tiny_data.data_bin, tmp_path / "second", "--max-update", "2", "--patience", "1")
    assert (tmp_path / "second" / "checkpoint_best.pt").exists()
    assert "early stop" not in second.log


# A pipeline program that a fairseq command run in its process (run_logged) left with fairseq's
# prefetching thread (BackgroundConsumer, daemonic) running torch code, interrupted by Ctrl-C
# (Python's SIGINT handler raises KeyboardInterrupt in the main thread).
INTERRUPTED_PROGRAM = """
import threading, time
import torch
from fairseq_entmax.pipeline.tools import exit_with_status

def prefetch():
    batch = torch.randn(64, 512)
    while True:
        torch.cat([batch, batch]).sum(0)

def main():
    threading.Thread(target=prefetch, daemon=True).start()
    time.sleep(0.2)
    raise KeyboardInterrupt

exit_with_status(main)
"""


def test_ctrl_c_ends_a_pipeline_program_with_status_130_and_a_hint(tmp_path):
    """An interpreter that finalizes while such a thread runs torch code aborts ("terminate
    called without an active exception", every time on this machine): an interrupted program
    ends at once instead, saying how to go on. Otherwise it ends with main's status."""
    program = tmp_path / "program.py"
    program.write_text(INTERRUPTED_PROGRAM, encoding="utf-8")
    interrupted = run([sys.executable, program], check=False, timeout=120)
    assert interrupted.returncode == 130, interrupted.stderr[-2000:]
    assert "interrupted: the same command again goes on" in interrupted.stderr
    assert "terminate called" not in interrupted.stderr and "Fatal Python error" not in interrupted.stderr
    with pytest.raises(SystemExit) as ended:
        exit_with_status(lambda: 2)
    assert ended.value.code == 2
