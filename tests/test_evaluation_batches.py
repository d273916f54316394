"""Every sentence evaluated (fairseq_entmax.repairs.evaluation_batches): fairseq 0.12 drops the last
batch when its size is not a multiple of --required-batch-size-multiple (8 by default,
fairseq issue #5036); with the plugin, generation and validation see every sentence, while
training keeps fairseq's batches.

On a corpus of 20 sentences per split (not a multiple of 8), without
--required-batch-size-multiple: the same plain `--arch transformer` checkpoint goes through
fairseq-generate and fairseq-validate with the plugin (--user-dir) and without it. Plain
fairseq is the positive control: it shows the defect (16 of 20) that the plugin repairs.
"""

import json
import re

import pytest

from conftest import TINY_MODEL_ARGS
from helpers import OPTIMIZATION_ARGS, USER_DIR, fairseq_command, preprocess, run, write_tiny_corpus

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = pytest.mark.slow

N = 20  # sentences in each split: 16 + a last batch of 4 that fairseq drops
FAIRSEQ_DROPS_TO = 16
FLAVOURS = {"plugin": ["--user-dir", USER_DIR], "plain": []}
# Plain fairseq on torch >= 2.6 cannot read its own checkpoints without the plugin's allowlist
# (argparse.Namespace): let it unpickle this trusted file the old way.
PLAIN_LOADING = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
TRAINING_ARGS = [
    "--arch",
    "transformer",
    *TINY_MODEL_ARGS[2:],
    *OPTIMIZATION_ARGS,
    # 20 training sentences in batches of 8: 8 + 8 + 4, fairseq's trainer drops the 4.
    # One validation batch of up to 20 sentences: plain fairseq cuts it to 16.
    "--batch-size",
    "8",
    "--batch-size-valid",
    str(N),
    "--max-epoch",
    "1",
    "--log-format",
    "json",
    "--log-interval",
    "1",
    "--no-progress-bar",
    "--no-epoch-checkpoints",
]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("twenty_sentences")
    raw = write_tiny_corpus(root / "raw", n_train=N, n_valid=N, n_test=N)
    return preprocess(raw, root / "data-bin")


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    """Factory: trained(flavour) -> (checkpoint_last.pt, fairseq-train's output), a plain
    transformer trained for one epoch with (plugin) or without (plain) the plugin."""
    runs = {}

    def train(flavour):
        if flavour not in runs:
            save_dir = tmp_path_factory.mktemp(f"train_{flavour}")
            # Plain fairseq in a process of its own: this one may have loaded the plugin.
            command = [fairseq_command("fairseq-train"), data_bin, *FLAVOURS[flavour], *TRAINING_ARGS]
            proc = run([*command, "--save-dir", save_dir], process=flavour == "plain")
            runs[flavour] = save_dir / "checkpoint_last.pt", proc.stdout + proc.stderr
        return runs[flavour]

    return train


def json_log_line(output, key):
    """The last json log line of fairseq's output that has `key`."""
    for line in reversed(output.splitlines()):
        found = re.search(r"(\{.*\})\s*$", line)
        if found and key in found.group(1):
            return json.loads(found.group(1))
    raise AssertionError(f"no json log line with {key} in:\n{output[-3000:]}")


def test_training_batches_are_fairseqs_and_its_validation_sees_every_sentence(trained):
    """Training: 2 updates per epoch with the plugin as without (20 // 8 batches: the last,
    of 4, dropped as fairseq does). fairseq-train's validation: one batch of all 20 sentences
    with the plugin, 16 without."""
    plugin, plain = trained("plugin")[1], trained("plain")[1]
    for output in (plugin, plain):
        assert json_log_line(output, "train_num_updates")["train_num_updates"] == "2", output[-3000:]
    assert float(json_log_line(plugin, "valid_bsz")["valid_bsz"]) == N
    assert float(json_log_line(plain, "valid_bsz")["valid_bsz"]) == FAIRSEQ_DROPS_TO


@pytest.mark.parametrize("flavour, translated", [("plugin", N), ("plain", FAIRSEQ_DROPS_TO)])
def test_generate_translates_every_sentence(flavour, translated, trained, data_bin):
    checkpoint = trained("plain")[0]
    proc = run(
        [
            fairseq_command("fairseq-generate"),
            data_bin,
            "--path",
            checkpoint,
            *FLAVOURS[flavour],
            "--cpu",
            "--beam",
            "1",
            "--max-len-b",
            "12",
        ],
        env=PLAIN_LOADING,
    )
    hypotheses = {line.split("\t")[0] for line in proc.stdout.splitlines() if line.startswith("H-")}
    assert len(hypotheses) == translated, proc.stdout[-3000:]
    assert f"Translated {translated} sentences" in proc.stdout + proc.stderr


@pytest.mark.parametrize("flavour, evaluated", [("plugin", N), ("plain", FAIRSEQ_DROPS_TO)])
def test_validate_evaluates_every_sentence(flavour, evaluated, trained, data_bin):
    """fairseq-validate --batch-size 20: one batch, whose size (bsz) is the sentences seen."""
    checkpoint = trained("plain")[0]
    proc = run(
        [
            fairseq_command("fairseq-validate"),
            data_bin,
            "--path",
            checkpoint,
            *FLAVOURS[flavour],
            "--cpu",
            "--task",
            "translation",
            "--valid-subset",
            "test",
            "--batch-size",
            str(N),
            "--log-format",
            "json",
        ],
        env=PLAIN_LOADING,
    )
    output = proc.stdout + proc.stderr
    assert float(json_log_line(output, "bsz")["test_bsz"]) == evaluated, output[-3000:]
