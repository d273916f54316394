"""Every Python block of README.md and docs/*.md runs, as written, against tiny models.

A block is found by its file and its first line. It runs in a fresh folder with the names it
uses without defining them (GIVEN: scores, a tiny Marian saved where the block loads one, a
trained fairseq checkpoint where it reads one), and with the replacements of SHORTER, which
shorten a long job (a training of 5,000 steps) without changing what it calls. A block that is
not in the table fails the test, and so does an entry whose block is gone.
"""

import os
import re
from pathlib import Path

import pytest
import torch

from huggingface_tiny import FAMILIES, tiny_batch, tiny_model

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
HEADS = 8


def python_blocks():
    """(file relative to the repository, first line, text) of each fenced Python block."""
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            yield str(path.relative_to(REPO)), match.group(1).strip().splitlines()[0], match.group(1)


def _scores():
    return {"scores": torch.randn(2 * HEADS, 5, 7), "alpha": 1.5}


def _attention():
    q, k, v = (torch.randn(2, HEADS, 6, 16, requires_grad=True) for _ in range(3))
    return {"q": q, "k": k, "v": v, "mask": torch.rand(2, 1, 6, 6) > 0.3}


def _marian(folder):
    """What the Hugging Face blocks use: a tiny sparsified Marian, its config, a batch, and a
    Marian saved under each path the blocks load (a local directory, as docs/huggingface.md says)."""
    from transformers import AutoModelForSeq2SeqLM, MarianMTModel

    import fairseq_entmax.huggingface as sparse_hf

    for path in ("path/to/model", "opus-mt-de-en"):
        tiny_model("marian", "eager").save_pretrained(folder / path)
    model = sparse_hf.sparsify(tiny_model("marian", "eager"), "alpha_entmax", alpha_init=1.5, alpha_warmup_updates=4)
    model.save_pretrained(folder / "saved")
    inputs, _ = tiny_batch("marian")
    labeled = dict(inputs, labels=inputs["decoder_input_ids"])
    example = {name: tensor[0] for name, tensor in labeled.items() if name != "decoder_input_ids"}
    return {
        "sparse_hf": sparse_hf,
        "MarianMTModel": MarianMTModel,
        "AutoModelForSeq2SeqLM": AutoModelForSeq2SeqLM,
        "torch": torch,
        "config": FAMILIES["marian"]()[1],
        "model": model,
        "inputs": inputs,
        "batches": [labeled, labeled],
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.01),
        "path": str(folder / "saved"),
        "train": [example] * 4,
        "collator": None,
    }


def _fairseq_checkpoints(folder, trained_model):
    """A trained checkpoint of each normalizer the blocks name, and the data-bin, where they look."""
    for normalizer in ("softmax", "alpha_entmax"):
        model = trained_model(normalizer)
        (folder / "checkpoints" / normalizer).mkdir(parents=True)
        os.symlink(model.checkpoint, folder / "checkpoints" / normalizer / "checkpoint_best.pt")
    os.symlink(trained_model("alpha_entmax").data_bin, folder / "data-bin")
    return {}


def _rows_sum_to_one(names):
    torch.testing.assert_close(names["weights"].sum(-1), torch.ones(2 * HEADS, 5))


def _attention_output(names):
    assert names["out"].shape == (2, HEADS, 6, 16) and names["out"].requires_grad


def _one_row_per_attention_call(names):
    # 2 encoder self-attentions, then per decoder layer its self- and cross-attention.
    assert [row["attention_type"] for row in names["captured"]] == ["encoder_self"] * 2 + ["decoder_self", "cross"] * 2


def _two_models_analyzed(names):
    assert [len(model["js"]) for model in names["analysis"]["models"]] == [6, 6]


def _alphas_halfway_through_the_warm_up(names):
    # 2 of the 4 warm-up updates: halfway from 1 to 1.5 (the tiny model's alphas barely learn).
    alphas = [row["alpha"] for row in names["sparse_hf"].alpha_table(names["model"])]
    assert alphas and all(abs(alpha - 1.25) < 1e-4 for alpha in alphas)


# (file, first line) -> (what the block needs: "scores", "attention", "marian" or "fairseq";
# {text in the block: its replacement}; a check of what it made, or None).
PYTHON_BLOCKS = {
    ("README.md", "from fairseq_entmax.normalizers import entmax15, alpha_entmax, topk_softmax, build_normalizer"): ("scores", {}, _rows_sum_to_one),
    ("docs/analysis.md", "from fairseq_entmax.analysis import analyze"): ("fairseq", {"data-bin/iwslt14.tokenized.de-en": "data-bin", "num_sentences=1000": "num_sentences=8"}, _two_models_analyzed),
    ("docs/attention.md", "from fairseq_entmax.attention import scaled_dot_product_attention"): ("attention", {}, _attention_output),
    ("docs/fairseq.md", "import fairseq_entmax"): ("fairseq", {}, None),
    ("docs/huggingface.md", "import fairseq_entmax.huggingface as sparse_hf   # registers the attention implementations"): ("marian", {}, None),
    ("docs/huggingface.md", "with sparse_hf.capture_attention_weights(model) as captured:"): ("marian", {}, _one_row_per_attention_call),
    ("docs/huggingface.md", 'model = sparse_hf.sparsify(model, {"encoder_self": "entmax15", "decoder_self": "alpha_entmax", "cross": "softmax"},'): ("marian", {}, None),
    ("docs/huggingface.md", "model = sparse_hf.from_pretrained(MarianMTModel, path)            # or an Auto class"): ("marian", {}, None),
    ("docs/huggingface.md", "import fairseq_entmax.huggingface as sparse_hf"): ("marian", {"max_steps=5000, logging_steps=100": "max_steps=2, logging_steps=1, report_to=[]"}, None),
    ("docs/huggingface.md", "sparse_hf.set_num_updates(model, 0)"): ("marian", {}, _alphas_halfway_through_the_warm_up),
    ("docs/huggingface.md", "from peft import LoraConfig, PeftModel, get_peft_model"): ("marian", {}, None),
    ("docs/huggingface.md", 'model = sparse_hf.sparsify(model, "alpha_entmax", alpha_init=1.5, alpha_warmup_updates=1000)'): ("marian", {}, None),
    ("docs/normalizers.md", "import torch"): ("scores", {}, None),
    ("docs/normalizers.md", "from fairseq_entmax.normalizers import build_normalizer"): ("scores", {}, None),
    ("docs/normalizers.md", "from fairseq_entmax import entmax          # instead of: import entmax"): ("scores", {}, None),
}  # fmt: skip


def test_every_python_block_of_the_docs_is_in_the_table():
    found = {(path, first) for path, first, _ in python_blocks()}
    assert found - PYTHON_BLOCKS.keys() == set(), "a Python block the test does not know: add it to PYTHON_BLOCKS"
    assert PYTHON_BLOCKS.keys() - found == set(), "an entry whose block is gone"


@pytest.mark.parametrize("key", sorted(PYTHON_BLOCKS), ids=lambda key: f"{key[0]}:{key[1][:50]}")
def test_documented_python_block_runs(key, tmp_path, monkeypatch, request):
    needs, shorter, check = PYTHON_BLOCKS[key]
    [text] = [text for path, first, text in python_blocks() if (path, first) == key]
    for old, new in shorter.items():
        assert old in text, f"the block no longer has {old!r}"
        text = text.replace(old, new)
    monkeypatch.chdir(tmp_path)
    if needs == "scores":
        names = _scores()
    elif needs == "attention":
        names = _attention()
    elif needs == "marian":
        names = _marian(tmp_path)
    else:
        request.getfixturevalue("fairseq_plugin")
        names = _fairseq_checkpoints(tmp_path, request.getfixturevalue("trained_model"))
    torch.manual_seed(0)
    exec(compile(text, f"{key[0]} block {key[1][:40]!r}", "exec"), names)
    if check is not None:
        check(names)
