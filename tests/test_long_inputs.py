"""A 1,024-token source sentence through fairseq-train and fairseq-generate with every
normalizer (CPU, a tiny model, all attention with that normalizer).

The training set holds two pairs, each with a 1,024-word source (1,025 tokens with EOS), one
pair per batch: the two updates of a run, in one epoch, train on both. (fairseq-train drops a
sentence longer than the model's positions without failing, and then makes no update;
--max-epoch bounds such a run.) The test set is a third 1,024-word source, which
fairseq-generate translates with beam search. Both commands get --required-batch-size-multiple
1: fairseq 0.12 drops a last batch whose size is not a multiple of it (8 by default; fairseq
issue #5036), which would leave nothing to translate, and one of the two training sentences
out of the epoch.

fairseq-preprocess, then fairseq-train and fairseq-generate per normalizer, run as their
console scripts' own functions (fairseq_cli.*.cli_main, what the fairseq-* scripts call) one
after the other in a single process: importing fairseq costs 4-8 s a process on this machine,
more than the work of all eleven commands together. Peak memory is measured by
benchmarks/long_inputs.py, not here.
"""

import json
import math
import random
import re
import sys

import pytest

from fairseq_entmax.normalizers import NORMALIZER_NAMES
from helpers import USER_DIR, run

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = pytest.mark.slow

SOURCE_WORDS = 1024
TARGET_WORDS = 12

# Each command runs in this process, between markers; an exception (SystemExit included) is
# printed and the next command runs, so that one normalizer's failure fails only its test.
# stderr (fairseq's logging) goes to stdout, so that each command's log is between its markers.
RUNNER = """
import json
import os
import sys
import traceback

os.dup2(1, 2)

from fairseq_cli import generate, preprocess, train

MAINS = {"fairseq-preprocess": preprocess.cli_main, "fairseq-train": train.cli_main,
         "fairseq-generate": generate.cli_main}
for tag, command, args in json.load(open(sys.argv[1])):
    print(f"=== start {tag}", flush=True)
    sys.argv = [command, *args]
    try:
        MAINS[command]()
        status = "ok"
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        status = "failed"
    print(f"=== {status} {tag}", flush=True)
"""

# 1+1 layers, width 16, 2 heads: the attention over 1,025 keys is the work.
LONG_MODEL_ARGS = [
    "--arch",
    "adaptively_sparse_transformer",
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--share-all-embeddings",
    "--dropout",
    "0",
]
POSITIONS = ["--max-source-positions", "2048", "--max-target-positions", "2048"]


def write_long_corpus(directory, seed=0):
    """train (2 pairs) and test (1 pair): 1,024-word sources of the tiny corpus' words, targets
    the first TARGET_WORDS source words mapped and reversed (as helpers.write_tiny_corpus)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    for split, n in (("train", 2), ("test", 1)):
        sources = [[f"s{rng.randrange(30)}" for _ in range(SOURCE_WORDS)] for _ in range(n)]
        targets = [[f"t{w[1:]}" for w in reversed(source[:TARGET_WORDS])] for source in sources]
        (directory / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s in sources))
        (directory / f"{split}.tgt").write_text("".join(" ".join(t) + "\n" for t in targets))
    return directory


# The options of the commands below that do not name a path or a normalizer.
TRAIN_OPTIONS = (
    "--max-tokens 1100 --required-batch-size-multiple 1 --max-update 2 --max-epoch 2 --optimizer adam --lr 0.001 "
    "--criterion label_smoothed_cross_entropy --cpu --num-workers 0 --seed 1 --disable-validation "
    "--no-epoch-checkpoints --log-format json --log-interval 1 --no-progress-bar"
).split()
GENERATE_OPTIONS = (
    "--gen-subset test --beam 4 --batch-size 1 --required-batch-size-multiple 1 --max-len-a 0 "
    f"--max-len-b {TARGET_WORDS} --cpu --num-workers 0"
).split()


def commands(raw, data_bin, work):
    yield (
        "preprocess",
        "fairseq-preprocess",
        ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train", "--testpref", raw / "test"]
        + ["--destdir", data_bin, "--joined-dictionary", "--workers", "1"],
    )
    for normalizer in NORMALIZER_NAMES:
        save_dir = work / normalizer
        yield (
            f"train {normalizer}",
            "fairseq-train",
            [data_bin, "--user-dir", USER_DIR, *LONG_MODEL_ARGS, "--attention-normalizer", normalizer, *POSITIONS]
            + [*TRAIN_OPTIONS, "--save-dir", save_dir],
        )
        yield (
            f"generate {normalizer}",
            "fairseq-generate",
            [data_bin, "--user-dir", USER_DIR, "--path", save_dir / "checkpoint_last.pt", *POSITIONS]
            + [*GENERATE_OPTIONS, "--results-path", save_dir],
        )


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory):
    """{tag: (status, output)} of every command, and the folder of each normalizer's run."""
    work = tmp_path_factory.mktemp("long_inputs")
    raw = write_long_corpus(work / "raw")
    (work / "runner.py").write_text(RUNNER)
    (work / "commands.json").write_text(
        json.dumps(
            [[tag, command, [str(a) for a in args]] for tag, command, args in commands(raw, work / "data-bin", work)]
        )
    )
    proc = run([sys.executable, work / "runner.py", work / "commands.json"])
    sections = re.findall(r"^=== start (.*?)\n(.*?)^=== (ok|failed) \1$", proc.stdout, flags=re.M | re.S)
    return {tag: (status, output) for tag, output, status in sections}, work


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
def test_a_1024_token_source_trains_and_translates(long_runs, normalizer):
    runs, work = long_runs
    assert runs["preprocess"][0] == "ok", runs["preprocess"][1][-3000:]
    for step in ("train", "generate"):
        status, output = runs[f"{step} {normalizer}"]
        assert status == "ok", output[-5000:]

    # Two updates in one epoch: one per 1,025-token source (each alone in its batch), with a
    # finite loss. (fairseq's json log lines, "...train_inner...{json}", whatever the format of
    # the logger's prefix.)
    output = runs[f"train {normalizer}"][1]
    records = [
        json.loads(line[line.index("{") :])
        for line in output.splitlines()
        if re.search(r"\btrain_inner\b", line) and "{" in line
    ]
    assert [(r["epoch"], int(r["num_updates"])) for r in records] == [(1, 1), (1, 2)], output[-3000:]
    assert all(math.isfinite(float(r["loss"])) for r in records)

    generated = (work / normalizer / "generate-test.txt").read_text()
    source = re.search(r"^S-0\t(.*)$", generated, flags=re.M).group(1).split()
    assert len(source) == SOURCE_WORDS
    score, hypothesis = re.search(r"^H-0\t(\S+)\t(.*)$", generated, flags=re.M).groups()
    assert math.isfinite(float(score))
    assert hypothesis.split() and all(re.fullmatch(r"[st]\d+", w) for w in hypothesis.split()), hypothesis
