"""fairseq_entmax.pipeline.tools.run_logged runs fairseq's console scripts in its own process: the
command's output, exit status and messages are those of the script run as a process, and each
command starts from fairseq's state of a fresh process."""

import logging

import pytest
import torch

from fairseq_entmax.pipeline.tools import run_logged, run_reporting_errors
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


def test_ctrl_c_ends_a_pipeline_program_with_status_130_and_a_hint(capsys):
    def interrupted(args):
        raise KeyboardInterrupt  # what Python's SIGINT handler raises

    assert run_reporting_errors(interrupted, None) == 130
    assert "interrupted: the same command again goes on" in capsys.readouterr().err
