"""The reduced-scale reproduction (examples/reproduction/reduced_scale.py) at its tiny budget,
on the real IWSLT16 sample in ../shared/data: every stage runs, the table groups seeds per
normalizer, paired differences to softmax with their intervals, paired bootstrap p-values and
learning curves are reported, the patience stops a training that no longer improves, a rerun
reuses what is finished, and bad input stops before any work. The report's pure parts (the
t quantile, the paired interval, the tables, the runs of --models) on hand-made rows whose
answers are known."""

import json
import math
import re
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from examples.reproduction import reduced_scale
from examples.reproduction.reduced_scale import parse_args, planned_runs, summarize
from fairseq_entmax.pipeline.seeds import (
    format_difference,
    paired_differences,
    paired_differences_table,
    paired_interval,
)
from helpers import assert_run_executed_its_dry_run, run, run_main

# Every test here trains through fairseq-train or runs a fairseq command, a recipe or the quickstart.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# As the docs run it, from the repository root (cwd=REPO).
SCRIPT = (sys.executable, "-m", "examples.reproduction.reduced_scale")
SAMPLE = REPO.parent / "shared" / "data" / "iwslt16_de_en_sample"

needs_shared_data = pytest.mark.requires(
    (SAMPLE / "train.de").exists(), f"the reproduction reads the IWSLT16 sample from {SAMPLE}, absent here"
)


# Two normalizers, two seeds, 8 updates each, on the IWSLT16 sample.
TINY_OPTIONS = ("--budget", "tiny", "--models", "softmax", "topk", "--seeds", "1", "2", "--max-update", "8")


@pytest.fixture(scope="module")
def tiny_reproduction(tmp_path_factory):
    work = tmp_path_factory.mktemp("reproduction") / "work"
    command = [*SCRIPT, *TINY_OPTIONS, "--work-dir", work, "--data", SAMPLE]
    first = run(command, timeout=900, cwd=REPO)
    again = run_main(command)  # reuses everything: no process of its own to pay for
    return work, first.stdout, again.stdout


@needs_shared_data
def test_the_run_executed_exactly_its_dry_run(tiny_reproduction):
    """Every command the first run started and each Python step it called, in order, is a line of
    its dry run; the rerun started no command (its models, translations and analysis reused)."""
    work, _, _ = tiny_reproduction
    runs = assert_run_executed_its_dry_run(SCRIPT, [*TINY_OPTIONS, "--data", SAMPLE], work)
    assert len(runs) == 2
    assert sum(line.split()[0].endswith("fairseq-train") for line in runs[0]) == 4
    assert runs[1] and all(line.startswith("# ") for line in runs[1]), runs[1]


@needs_shared_data
def test_every_normalizer_and_seed_is_trained_translated_scored_and_tabled(tiny_reproduction):
    work, output, _ = tiny_reproduction
    rows = json.loads((work / "results.json").read_text())["runs"]
    assert sorted((r["model"], r["seed"]) for r in rows) == [("softmax", 1), ("softmax", 2), ("topk", 1), ("topk", 2)]
    test_size = len((work / "raw" / "test.en").read_text(encoding="utf-8").splitlines())
    assert test_size == 50  # the tiny budget's slice of TED tst2014
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
    # One line per normalizer with mean ± standard deviation over its two seeds.
    table = (work / "results.md").read_text()
    assert table in output
    softmax_line = next(line for line in table.splitlines() if line.startswith("| softmax |"))
    chrf = [r["chrf"] for r in softmax]
    assert f"{statistics.mean(chrf):.2f} ± {statistics.stdev(chrf):.2f}" in softmax_line
    assert softmax_line.rstrip().endswith("| 2 |")
    best_updates = [r["best_update"] for r in softmax]
    assert f"| {statistics.mean(best_updates):.0f} ± {statistics.stdev(best_updates):.0f} |" in softmax_line
    # The attention analysis per normalizer: density, head diversity and specialised heads.
    heads = table[table.index("Attention analysis") :]
    topk_heads = next(line for line in heads.splitlines() if line.startswith("| topk |"))
    density = [r["density"]["encoder_self"] for r in topk]
    assert topk_heads.startswith(f"| topk | {statistics.mean(density):.3f} ± {statistics.stdev(density):.3f} |")
    assert all(set(r["js"]) == {"encoder_self", "decoder_self", "cross"} for r in rows)
    assert all(set(r["specialised_heads"]) == {"positional", "bpe_merging", "interrogation"} for r in rows)


@needs_shared_data
def test_paired_differences_to_softmax_with_their_interval(tiny_reproduction):
    work, output, _ = tiny_reproduction
    results = json.loads((work / "results.json").read_text())
    rows = {(r["model"], r["seed"]): r for r in results["runs"]}
    topk = results["paired_differences"]["bleu"]["topk"]
    assert topk["seeds"] == [1, 2]
    expected = [rows[("topk", s)]["bleu"] - rows[("softmax", s)]["bleu"] for s in (1, 2)]
    assert topk["differences"] == pytest.approx(expected)
    # Two seeds: the interval is the mean ± t(0.975, 1 df) * sd / sqrt(2).
    half = 12.706 * statistics.stdev(expected) / math.sqrt(2)
    assert topk["low"] == pytest.approx(statistics.mean(expected) - half, rel=1e-3, abs=1e-6)
    line = next(line for line in output.splitlines() if line.startswith("| topk | 1, 2 |"))
    assert format_difference(topk) in line
    assert set(results["paired_differences"]) == {"bleu_tok", "bleu", "chrf", "best_valid_accuracy"}


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
    epoch, training stops at the second validation, long before the update cap. On the first
    300 training pairs of the IWSLT16 sample (and 50 of valid and test): epochs of a few updates."""
    data = tmp_path / "data"
    data.mkdir()
    for split, lines in (("train", 300), ("valid", 50), ("test", 50)):
        for lang in ("de", "en"):
            head = (SAMPLE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:lines]
            (data / f"{split}.{lang}").write_text("\n".join(head) + "\n", encoding="utf-8")
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
            "--data",
            data,
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
    proc = run_main(command, check=False)
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


# --- the report's pure parts, on hand-made rows ---------------------------------------------


def test_paired_interval_of_known_differences():
    # differences 1, 0, 2: mean 1, sd 1, t(0.975, 2) = 4.3027: 1 ± 4.3027 / sqrt(3) = 1 ± 2.4842
    interval = paired_interval([1.0, 0.0, 2.0])
    assert interval["n"] == 3 and interval["mean"] == pytest.approx(1.0) and interval["sd"] == pytest.approx(1.0)
    assert interval["low"] == pytest.approx(-1.4842, abs=1e-4) and interval["high"] == pytest.approx(3.4842, abs=1e-4)
    # equal differences: an interval of width 0
    assert paired_interval([0.5, 0.5])["low"] == pytest.approx(0.5)
    # one seed: a difference, no interval
    assert paired_interval([0.7]) == {"n": 1, "mean": 0.7, "sd": None, "low": None, "high": None}


def result_row(model, seed, bleu, **more):
    """A hand-made result row with what summarize reads."""
    row = {
        "model": model,
        "seed": seed,
        "bleu": bleu,
        "bleu_tok": bleu + 0.5,
        "chrf": 2 * bleu,
        "best_valid_accuracy": 50.0 + bleu / 10,
        "best_valid_ppl": 12.0,
        "best_update": 1000 + 100 * seed,
        "updates": 1300 + 100 * seed,
        "stopped_early": True,
        "train_seconds": 600.0,
        "bleu_tok_signature": "tok-signature",
        "bleu_signature": "bleu-signature",
        "chrf_signature": "chrf-signature",
        "density": {"encoder_self": 1.0, "decoder_self": 1.0, "cross": 1.0},
        "alpha": {},
        "js": {"encoder_self": 0.25, "decoder_self": 0.5, "cross": 0.75},
        "specialised_heads": {"positional": 1, "bpe_merging": 0, "interrogation": seed - 1},
    }
    row.update(more)
    return row


HAND_MADE_ROWS = [
    # softmax 30, 31, 32; entmax15 31, 31, 34 (differences 1, 0, 2); sparsemax seed 1 only (-1);
    # topk seeds 2 and 4, of which only 2 has a softmax to pair with (+2)
    result_row("entmax15", 1, 31.0),
    result_row("softmax", 1, 30.0),
    result_row("sparsemax", 1, 29.0, stopped_early=False),
    result_row("softmax", 2, 31.0),
    result_row("entmax15", 2, 31.0),
    result_row("topk", 2, 33.0),
    result_row("softmax", 3, 32.0),
    result_row("entmax15", 3, 34.0),
    result_row("topk", 4, 40.0),
]


def test_differences_are_paired_by_seed():
    differences = paired_differences(HAND_MADE_ROWS, "bleu")
    assert list(differences) == ["entmax15", "sparsemax", "topk"]
    assert differences["entmax15"]["seeds"] == [1, 2, 3]
    assert differences["entmax15"]["differences"] == [1.0, 0.0, 2.0]
    assert differences["entmax15"]["high"] == pytest.approx(3.4842, abs=1e-4)
    assert differences["sparsemax"]["seeds"] == [1] and differences["sparsemax"]["mean"] == -1.0
    assert differences["topk"]["seeds"] == [2] and differences["topk"]["mean"] == 2.0
    # a metric a run lacks leaves that seed out of the pairing
    rows = [
        dict(r, best_valid_accuracy=None) if (r["model"], r["seed"]) == ("entmax15", 3) else r for r in HAND_MADE_ROWS
    ]
    assert paired_differences(rows, "best_valid_accuracy")["entmax15"]["seeds"] == [1, 2]


def test_paired_differences_table_shows_each_normalizer_with_its_interval():
    table = "\n".join(paired_differences_table(HAND_MADE_ROWS))
    assert table.splitlines()[0] == "| model | seeds | tok BLEU | sacreBLEU | chrF | valid accuracy |"
    # tok BLEU and sacreBLEU differ by the same 1, 0, 2; chrF by twice that; accuracy by a tenth
    assert "| entmax15 | 1, 2, 3 | +1.00 [-1.48, +3.48] | +1.00 [-1.48, +3.48] | +2.00 [-2.97, +6.97] " in table
    assert "| +0.10 [-0.15, +0.35] |" in table
    assert "| sparsemax | 1 | -1.00 (1 seed) | -1.00 (1 seed) | -2.00 (1 seed) | -0.10 (1 seed) |" in table
    assert "| topk | 2 | +2.00 (1 seed) |" in table
    assert paired_differences_table([r for r in HAND_MADE_ROWS if r["model"] != "softmax"]) == []


def test_summary_has_a_line_per_normalizer_softmax_first_with_best_update_and_heads():
    args = SimpleNamespace(data=Path("multi30k"), budget="converged", seeds=[1, 2, 3])
    budget = dict(reduced_scale.BUDGETS["converged"])
    report = summarize(HAND_MADE_ROWS, args, {"train": 100, "valid": 10, "test": 10}, budget, [], None)
    lines = report.splitlines()
    first = lines.index("|---|---|---|---|---|---|---|---|---|---|---|") + 1
    normalizers = [line.split(" | ")[0][2:] for line in lines[first : lines.index("", first)]]
    assert normalizers == ["softmax", "entmax15", "sparsemax", "topk"]
    softmax = next(line for line in lines if line.startswith("| softmax | "))
    # tok BLEU 30.5, 31.5, 32.5; sacreBLEU 30, 31, 32; chrF 60, 62, 64; accuracy 53, 53.1, 53.2;
    # best update 1100, 1200, 1300
    assert softmax.startswith("| softmax | 31.50 ± 1.00 | 31.00 ± 1.00 | 62.00 ± 2.00 | 53.10 ± 0.10 | 12.00 ± 0.00 ")
    assert "| 1200 ± 100 | 1500 ± 100 | patience |" in softmax and softmax.endswith("| 3 |")
    assert next(line for line in lines if line.startswith("| sparsemax | ")).count("| cap |") == 1
    assert "seeds: softmax 1, 2, 3; entmax15 1, 2, 3; sparsemax 1; topk 2, 4" in lines[0]
    assert "| entmax15 | 1, 2, 3 | +1.00 [-1.48, +3.48] |" in report
    # the heads per normalizer: density, JS per attention type, specialised heads (mean ± sd)
    heads = report[report.index("Attention analysis") :]
    assert "| softmax | 1.000 ± 0.000 | 1.000 ± 0.000 | 1.000 ± 0.000 | 0.250 ± 0.000 | 0.500 ± 0.000 " in heads
    assert "| 0.750 ± 0.000 | 1.0 ± 0.0 | 0.0 ± 0.0 | 1.0 ± 1.0 | 3 |" in heads


def test_models_may_carry_their_own_seeds():
    args = parse_args(["--models", "softmax", "topk", "sparsemax:1", "--seeds", "1", "2"])
    assert planned_runs(args.models, args.seeds) == [
        ("softmax", 1),
        ("topk", 1),
        ("sparsemax", 1),
        ("softmax", 2),
        ("topk", 2),
    ]
    args = parse_args(["--models", "alpha_entmax:3,1", "entmax15"])
    assert planned_runs(args.models, args.seeds) == [
        ("alpha_entmax", 1),
        ("entmax15", 1),
        ("entmax15", 2),
        ("alpha_entmax", 3),
        ("entmax15", 3),
    ]
    default = parse_args([])
    assert planned_runs(default.models, default.seeds)[:3] == [("softmax", 1), ("entmax15", 1), ("alpha_entmax", 1)]


@pytest.mark.parametrize("spec,message", [("nosuch", "unknown normalizer 'nosuch'"), ("topk:one", "integers")])
def test_a_bad_models_entry_is_refused(spec, message, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--models", spec])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_the_learning_curves_figure_draws_every_normalizer(tmp_path, monkeypatch):
    from fairseq_entmax.analysis import plots

    drawn = {}
    real = plots.plot_learning_curves

    def recording(curves, path, **kwargs):
        drawn.update({label: len(runs) for label, runs in curves.items()})
        return real(curves, path, **kwargs)

    monkeypatch.setattr(plots, "plot_learning_curves", recording)
    seeds = {"softmax": 3, "entmax15": 3, "alpha_entmax": 3, "topk": 3, "sparsemax": 1}
    curves = {
        f"{normalizer}-seed{seed}": {
            "num_updates": [86, 172, 258],
            "ppl": [300.0 / seed, 100.0, 50.0],
            "accuracy": [20.0, 30.0 + seed, 40.0],
        }
        for normalizer, n in seeds.items()
        for seed in range(1, n + 1)
    }
    figure = reduced_scale.learning_curves_figure(curves, tmp_path / "learning_curves.png")
    assert figure == tmp_path / "learning_curves.png" and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn == seeds


def test_runs_of_a_normalizer_validated_at_different_updates_are_still_drawn(tmp_path, monkeypatch):
    """Without updates common to its runs a normalizer has no mean: its runs are drawn one by
    one rather than left out of the figure."""
    from fairseq_entmax.analysis import plots

    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    curves = {
        "softmax-seed1": {"num_updates": [86, 172], "ppl": [50.0, 20.0]},
        "softmax-seed2": {"num_updates": [86, 172], "ppl": [52.0, 21.0]},
        "topk-seed1": {"num_updates": [90, 180], "ppl": [60.0, 25.0]},
        "topk-seed2": {"num_updates": [85, 170], "ppl": [61.0, 26.0]},
    }
    assert reduced_scale.learning_curves_figure(curves, tmp_path / "curves.png") == tmp_path / "curves.png"
    (figure,) = figures
    _, labels = figure.axes[0].get_legend_handles_labels()
    assert labels == ["softmax (mean of 2 runs)", "topk (2 runs, each drawn)"]
