"""What a user training on a GPU relies on: fairseq-train --fp16 trains a learned alpha-entmax
model on real text (its loss falls), and fairseq-generate and fairseq-interactive translate
every sentence from its checkpoint.

Needs a CUDA device (the `cuda` marker: skipped elsewhere, run by `make gpu-check`).
"""

import json
import os
from pathlib import Path

import pytest

from helpers import USER_DIR, fairseq_command, preprocess, read_hypotheses, run, run_on_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# The text: what the GPU check gives (benchmarks.gpu_check sets GPU_CHECK_DATA), else
# .gpu-data/ (`make gpu-data`), else ../shared/data's IWSLT sample.
CANDIDATES = [
    Path(os.environ.get("GPU_CHECK_DATA", ROOT / ".gpu-data")),
    ROOT.parent / "shared" / "data" / "iwslt16_de_en_sample",
]
TEXT = next((d for d in CANDIDATES if (d / "train.de").exists()), None)
TRAIN_LINES, TEST_LINES, UPDATES = 3000, 32, 300
# 2+2 layers of width 256, 4 heads: the paper's model, small enough for seconds of training.
MODEL_ARGS = [
    option
    for side in ("encoder", "decoder")
    for option in (f"--{side}-layers", "2", f"--{side}-embed-dim", "256")
    + (f"--{side}-ffn-embed-dim", "1024", f"--{side}-attention-heads", "4")
]
# Outputs at most as long as the source and 10 tokens: a model this briefly trained may
# otherwise repeat a word up to fairseq's default of 200 tokens.
LENGTH = ["--max-len-a", "1", "--max-len-b", "10", "--fp16"]

pytestmark = [pytest.mark.cuda, pytest.mark.slow, pytest.mark.requires(TEXT is not None, "no text: make gpu-data")]


def test_fp16_training_then_generate_and_interactive_translate_every_sentence(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("de", "en"):
        lines = (TEXT / f"train.{lang}").read_text(encoding="utf-8").splitlines()[: TRAIN_LINES + TEST_LINES]
        (raw / f"train.{lang}").write_text("\n".join(lines[:TRAIN_LINES]) + "\n", encoding="utf-8")
        for split in ("valid", "test"):
            (raw / f"{split}.{lang}").write_text("\n".join(lines[TRAIN_LINES:]) + "\n", encoding="utf-8")
    data_bin = preprocess(raw, tmp_path / "bin", src="de", tgt="en")
    save_dir = tmp_path / "checkpoints"
    train = run(
        [fairseq_command("fairseq-train"), data_bin, "--user-dir", USER_DIR, "--arch", "adaptively_sparse_transformer"]
        + [*MODEL_ARGS, "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.001"]
        + ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--criterion", "label_smoothed_cross_entropy"]
        + ["--label-smoothing", "0.1", "--max-tokens", "4096", "--max-update", str(UPDATES), "--fp16"]
        + ["--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval", "1000", "--validate-interval", "1000"]
        + ["--log-format", "json", "--log-interval", "60", "--seed", "1", "--no-progress-bar"]
    )
    log = train.stdout + train.stderr
    losses = [float(json.loads(line[line.index("{") :])["loss"]) for line in log.splitlines() if "train_inner" in line]
    assert len(losses) >= 4 and losses[-1] < losses[0] - 1, losses

    checkpoint = save_dir / "checkpoint_last.pt"
    generated = run_on_checkpoint(
        "fairseq-generate", data_bin, checkpoint, "--gen-subset", "test", "--beam", "5", "--batch-size", "16", *LENGTH
    )
    assert sorted(read_hypotheses(generated.stdout)) == list(range(TEST_LINES))

    typed = (raw / "test.de").read_text(encoding="utf-8").splitlines()[:3]
    interactive = run_on_checkpoint(
        "fairseq-interactive", data_bin, checkpoint, "--beam", "5", "--source-lang", "de", "--target-lang", "en",
        *LENGTH, input="\n".join(typed) + "\n",
    )  # fmt: skip
    translations = read_hypotheses(interactive.stdout)
    assert sorted(translations) == [0, 1, 2] and all(text for _, text in translations.values())
