"""examples/huggingface/marian_toy.py as a user runs it, at its --tiny size: four Marian models
trained with Seq2SeqTrainer on the toy pair, then the saved softmax model sparsified and
fine-tuned. The tiny models learn nothing, so the checks are on what is printed, never on BLEU
values."""

import re
import sys
from pathlib import Path

import pytest

from helpers import run

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = (sys.executable, "-m", "examples.huggingface.marian_toy")
ROWS = ("softmax", "entmax15", "alpha_entmax", "topk", "softmax -> alpha_entmax")
ALPHA_CLAMP = (1.01, 2.0)
ATTENTION_TYPES = ("encoder_self", "decoder_self", "cross")


@pytest.fixture(scope="module")
def tiny_output(tmp_path_factory):
    work = tmp_path_factory.mktemp("marian_toy")
    proc = run([*EXAMPLE, "--tiny", "--work-dir", work], timeout=300, cwd=REPO)
    return work, proc.stdout


def _table(output):
    rows = re.findall(r"^\| ([^|]+?) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", output, re.MULTILINE)
    return {name: (float(bleu), float(chrf), float(loss)) for name, bleu, chrf, loss in rows}


def _alpha_block(output, title):
    block = output.split(title + ":\n", 1)[1].split("\n\n", 1)[0]
    lines = re.findall(r"^  (\w+) +layer (\d+): ([\d. ]+)$", block, re.MULTILINE)
    return {(kind, int(layer)): [float(value) for value in values.split()] for kind, layer, values in lines}


def test_prints_bleu_and_chrf_for_the_four_normalizers_and_the_fine_tuned_model(tiny_output):
    _, output = tiny_output
    table = _table(output)
    assert tuple(table) == ROWS
    for bleu, chrf, loss in table.values():
        assert 0.0 <= bleu <= 100.0
        assert 0.0 <= chrf <= 100.0
        assert loss > 0.0


def test_prints_one_learned_alpha_per_head_within_the_clamp(tiny_output):
    _, output = tiny_output
    for title in ("learned alphas (alpha_entmax)", "learned alphas after fine-tuning (softmax -> alpha_entmax)"):
        alphas = _alpha_block(output, title)
        # --tiny: one layer per stack, two heads per attention.
        assert sorted(alphas) == sorted((kind, 0) for kind in ATTENTION_TYPES)
        for values in alphas.values():
            assert len(values) == 2
            assert all(ALPHA_CLAMP[0] <= value <= ALPHA_CLAMP[1] for value in values)
    # alpha_init="random" draws distinct alphas per head.
    assert (
        len({value for values in _alpha_block(output, "learned alphas (alpha_entmax)").values() for value in values})
        > 1
    )


def test_the_warm_up_starts_at_the_saved_softmax_model(tiny_output):
    work, output = tiny_output
    match = re.search(
        r"BLEU ([\d.]+) before \(warm-up start; logits differ from the softmax model by ([\d.e+-]+)\), ([\d.]+) after",
        output,
    )
    assert match, output[-2000:]
    before, difference, after = float(match[1]), float(match[2]), float(match[3])
    # alpha 1 is softmax: the sparsified copy gives the softmax model's logits, so its translations.
    assert difference <= 1e-5
    assert before == _table(output)["softmax"][0]
    assert after == _table(output)["softmax -> alpha_entmax"][0]
    # The softmax model was saved as a pretrained model, with its tokenizer.
    assert (work / "softmax-pretrained" / "config.json").is_file()
    assert (work / "softmax-pretrained" / "tokenizer.json").is_file()
