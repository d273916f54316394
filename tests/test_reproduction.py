"""The reduced-scale reproduction (examples/reproduction/reduced_scale.py) at its tiny budget,
on the real IWSLT16 sample in ../shared/data: every stage runs, the table groups seeds per
variant, paired bootstrap p-values and learning curves are reported, the patience stops a
training that no longer improves, a rerun reuses what is finished, and bad input stops before
any work."""

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from helpers import run

# Every test here trains through fairseq-train or runs a fairseq command, a recipe or the quickstart.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# As the docs run it, from the repository root (cwd=REPO).
SCRIPT = (sys.executable, "-m", "examples.reproduction.reduced_scale")
SAMPLE = REPO.parent / "shared" / "data" / "iwslt16_de_en_sample"

needs_shared_data = pytest.mark.requires(
    (SAMPLE / "train.de").exists(), f"the reproduction reads the IWSLT16 sample from {SAMPLE}, absent here"
)


@pytest.fixture(scope="module")
def tiny_reproduction(tmp_path_factory):
    work = tmp_path_factory.mktemp("reproduction") / "work"
    command = [
        *SCRIPT,
        "--budget",
        "tiny",
        "--models",
        "softmax",
        "topk",
        "--seeds",
        "1",
        "2",
        "--max-update",
        "8",
        "--work-dir",
        work,
    ]
    first = run(command, timeout=900, cwd=REPO)
    again = run(command, timeout=600, cwd=REPO)
    return work, first.stdout, again.stdout


@needs_shared_data
def test_every_variant_and_seed_is_trained_translated_scored_and_tabled(tiny_reproduction):
    work, output, _ = tiny_reproduction
    rows = json.loads((work / "results.json").read_text())["runs"]
    assert sorted((r["model"], r["seed"]) for r in rows) == [("softmax", 1), ("softmax", 2), ("topk", 1), ("topk", 2)]
    test_size = len((work / "raw" / "test.en").read_text(encoding="utf-8").splitlines())
    assert test_size == 100  # the tiny budget's slice of TED tst2014
    for row in rows:
        name = f"{row['model']}-seed{row['seed']}"
        # The best checkpoint by validation accuracy, as the paper selects models.
        assert Path(row["checkpoint"]).name == "checkpoint_best.pt"
        assert len((work / "eval" / f"{name}-best" / "test.hyp").read_text(encoding="utf-8").splitlines()) == test_size
        assert 0 <= row["bleu_tok"] <= 100 and 0 <= row["chrf"] <= 100 and row["train_seconds"] > 0
        assert set(row["density"]) == {"encoder_self", "decoder_self", "cross"}
        # The validation figures are those fairseq logged at its best validation accuracy.
        log = (work / "models" / name / "train.log").read_text()
        logged = [
            (float(a), float(p))
            for p, a in re.findall(r"valid on 'valid' subset \| .*\| ppl ([\d.]+) \| accuracy ([\d.]+)", log)
        ]
        assert logged and (row["best_valid_accuracy"], row["best_valid_ppl"]) == max(logged)
        assert row["updates"] == 8 and row["stopped_early"] is False
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
def test_paired_bootstrap_against_softmax_per_seed(tiny_reproduction):
    work, output, _ = tiny_reproduction
    results = json.loads((work / "results.json").read_text())
    rows = {(r["model"], r["seed"]): r for r in results["runs"]}
    tests = results["paired_bootstrap"]
    assert sorted((t["model"], t["seed"]) for t in tests) == [("topk", 1), ("topk", 2)]
    for t in tests:
        assert 0 < t["bleu_p"] <= 1 and 0 < t["chrf_p"] <= 1
        # The scores compared are those of the table: sacreBLEU of the same translations.
        assert t["bleu"] == pytest.approx(rows[("topk", t["seed"])]["bleu"], abs=0.01)
        assert t["bleu_baseline"] == pytest.approx(rows[("softmax", t["seed"])]["bleu"], abs=0.01)
        assert t["chrf_baseline"] == pytest.approx(rows[("softmax", t["seed"])]["chrf"], abs=0.01)
        assert f"| {t['seed']} | topk | {t['bleu']:.2f} | {t['bleu_baseline']:.2f} | {t['bleu_p']:.4f} |" in output


@needs_shared_data
def test_learning_curves_are_written_from_the_training_logs(tiny_reproduction):
    work, _, _ = tiny_reproduction
    curves = json.loads((work / "results.json").read_text())["validation_curves"]
    assert set(curves) == {"softmax-seed1", "softmax-seed2", "topk-seed1", "topk-seed2"}
    for name, curve in curves.items():
        log = (work / "models" / name / "train.log").read_text()
        logged = [float(p) for p in re.findall(r"valid on 'valid' subset \| .*\| ppl ([\d.]+)", log)]
        assert curve["ppl"] == logged and curve["num_updates"][-1] == 8
    figure = work / "learning_curves.png"
    assert figure.stat().st_size > 0 and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_shared_data
def test_the_patience_stops_a_training_that_no_longer_improves(tmp_path):
    """With a learning rate of ~0 the validation accuracy cannot improve: with a patience of 1
    epoch, training stops at the second validation, long before the update cap."""
    work = tmp_path / "work"
    run(
        [
            *SCRIPT,
            "--budget",
            "tiny",
            "--models",
            "softmax",
            "--seeds",
            "1",
            "--max-update",
            "400",
            "--patience",
            "1",
            "--lr",
            "1e-12",
            "--work-dir",
            work,
        ],
        timeout=900,
        cwd=REPO,
    )
    [row] = json.loads((work / "results.json").read_text())["runs"]
    log = (work / "models" / "softmax-seed1" / "train.log").read_text()
    assert "early stop since valid performance hasn't improved for last 1 runs" in log
    assert row["stopped_early"] is True and row["epochs"] == 2 and row["updates"] < 400
    assert "| patience |" in (work / "results.md").read_text()


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
    command = [
        *SCRIPT,
        "--budget",
        "tiny",
        "--models",
        "softmax",
        "--seeds",
        "1",
        "--max-update",
        "8",
        "--work-dir",
        work,
        "--data",
        other,
    ]
    proc = run(command, check=False, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{other}" in proc.stderr and "another --work-dir" in proc.stderr and "Traceback" not in proc.stderr
    assert (work / "raw" / "train.de").read_text(encoding="utf-8") == before


def test_missing_data_is_reported_before_any_work(tmp_path):
    (tmp_path / "data").mkdir()
    proc = run(
        [*SCRIPT, "--data", tmp_path / "data", "--work-dir", tmp_path / "work"], check=False, timeout=60, cwd=REPO
    )
    assert proc.returncode == 2
    assert str(tmp_path / "data" / "train.de") in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "work").exists()
