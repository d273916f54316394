"""The reduced-scale reproduction (examples/reproduction/iwslt_small.py) at its tiny budget,
on the real IWSLT16 sample in ../shared/data: every stage runs, the table groups seeds per
variant, a rerun reuses what is finished, and bad input stops before any work."""
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from helpers import run

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "reproduction" / "iwslt_small.py"
SAMPLE = REPO.parent / "shared" / "data" / "iwslt16_de_en_sample"

needs_shared_data = pytest.mark.skipif(
    not (SAMPLE / "train.de").exists(), reason=f"the reproduction reads the IWSLT16 sample from {SAMPLE}, absent here"
)


@pytest.fixture(scope="module")
def tiny_reproduction(tmp_path_factory):
    work = tmp_path_factory.mktemp("reproduction") / "work"
    command = [sys.executable, SCRIPT, "--budget", "tiny", "--models", "softmax", "topk", "--seeds", "1", "2",
               "--max-update", "8", "--work-dir", work]
    first = run(command, timeout=900)
    again = run(command, timeout=600)
    return work, first.stdout, again.stdout


@needs_shared_data
def test_every_variant_and_seed_is_trained_translated_scored_and_tabled(tiny_reproduction):
    work, output, _ = tiny_reproduction
    rows = json.loads((work / "results.json").read_text())
    assert sorted((r["model"], r["seed"]) for r in rows) == [("softmax", 1), ("softmax", 2), ("topk", 1), ("topk", 2)]
    test_size = len((work / "raw" / "test.en").read_text(encoding="utf-8").splitlines())
    assert test_size == 100  # the tiny budget's slice of TED tst2014
    for row in rows:
        name = f"{row['model']}-seed{row['seed']}"
        assert len((work / "eval" / name / "test.hyp").read_text(encoding="utf-8").splitlines()) == test_size
        assert 0 <= row["bleu_tok"] <= 100 and 0 <= row["chrf"] <= 100 and row["train_seconds"] > 0
        assert set(row["density"]) == {"encoder_self", "decoder_self", "cross"}
        # The validation perplexity is the one fairseq logged last for this model.
        log = (work / "models" / name / "train.log").read_text()
        logged = re.findall(r"valid on 'valid' subset \| .*\| ppl ([\d.]+)", log)
        assert logged and row["valid_ppl"] == float(logged[-1]) > 1
    # Top-k (k = 8) attends to at most 8 keys; softmax to all of them.
    topk = [r for r in rows if r["model"] == "topk"]
    softmax = [r for r in rows if r["model"] == "softmax"]
    assert all(r["density"]["encoder_self"] < 1.0 for r in topk)
    assert all(r["density"]["encoder_self"] == pytest.approx(1.0) for r in softmax)
    # One line per variant with mean ± standard deviation over its two seeds.
    table = (work / "results.md").read_text()
    assert table in output
    softmax_line = next(line for line in table.splitlines() if line.startswith("| softmax |"))
    chrf = [r["chrf"] for r in softmax]
    assert f"{statistics.mean(chrf):.2f} ± {statistics.stdev(chrf):.2f}" in softmax_line
    assert softmax_line.rstrip().endswith("| 2 |")


@needs_shared_data
def test_rerun_reuses_data_and_trained_models(tiny_reproduction):
    _, _, again = tiny_reproduction
    assert again.count("already trained") == 4
    assert "training (" not in again and "tokenize:" not in again


@needs_shared_data
def test_rerun_with_other_data_is_refused(tiny_reproduction, tmp_path):
    """The work dir's corpus was cut from the IWSLT16 sample: a run given other data stops
    with the reason instead of training on the old corpus."""
    work, _, _ = tiny_reproduction
    other = tmp_path / "other"
    other.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            (other / f"{split}.{lang}").write_text("ein Satz .\nnoch einer .\n", encoding="utf-8")
    before = (work / "raw" / "train.de").read_text(encoding="utf-8")
    command = [sys.executable, SCRIPT, "--budget", "tiny", "--models", "softmax", "--seeds", "1",
               "--max-update", "8", "--work-dir", work, "--data", other]
    proc = run(command, check=False, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{other}" in proc.stderr and "another --work-dir" in proc.stderr and "Traceback" not in proc.stderr
    assert (work / "raw" / "train.de").read_text(encoding="utf-8") == before


def test_missing_data_is_reported_before_any_work(tmp_path):
    (tmp_path / "data").mkdir()
    proc = run([sys.executable, SCRIPT, "--data", tmp_path / "data", "--work-dir", tmp_path / "work"],
               check=False, timeout=60)
    assert proc.returncode == 2
    assert str(tmp_path / "data" / "train.de") in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "work").exists()
