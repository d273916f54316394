"""What `python -m examples.quickstart.convergence` gives its user: the quickstart run on the
first N pairs of a corpus for each size, and per size and model where the patience stopped
it, where it was best and where a patience on the loss would have stopped it, read from its
validation curve; rows of earlier runs for other sizes kept; sizes beyond the corpus refused."""

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.quickstart.convergence import patience_stop
from helpers import assert_run_executed_its_dry_run, run, write_tiny_corpus

REPO = Path(__file__).resolve().parents[1]
CONVERGENCE = (sys.executable, "-m", "examples.quickstart.convergence")


def brute_force_stop(values, patience, maximize):
    """fairseq's rule spelled out: after each validation, count those since the last new best."""
    sign = 1 if maximize else -1
    for stop in range(len(values)):
        seen = [sign * v for v in values[: stop + 1]]
        best = seen.index(max(seen))
        if stop - best >= patience:
            return stop, best
    seen = [sign * v for v in values]
    return None, seen.index(max(seen))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([1.0, 2.0, 3.0, 4.0]), min_size=1, max_size=14),
    st.integers(1, 3),
    st.booleans(),
)
def test_the_patience_stops_where_fairseqs_rule_does(values, patience, maximize):
    assert patience_stop(values, patience, maximize) == brute_force_stop(values, patience, maximize)


@pytest.mark.slow
def test_each_size_gets_a_row_read_from_its_validation_curve(tmp_path):
    raw = write_tiny_corpus(tmp_path / "raw")
    work = tmp_path / "work"
    work.mkdir()
    earlier = {
        "pairs": 400, "batch_tokens_per_pass": 2783, "model": "softmax", "updates": 32, "epochs": 8,
        "updates_per_epoch": 4, "stopped_by_patience": True, "best_update": 20, "best_epoch": 5,
        "best_accuracy": 14.39, "loss_stop_update": None, "loss_best_update": 32, "accuracy_at_loss_best": 14.1,
        "within_1_point_update": 20, "train_seconds": 14.0, "seconds_per_update": 0.44, "bleu": 0.0,
        "passes_at_stop": 11.8, "passes_at_best": 7.4,
    }  # fmt: skip
    (work / "convergence.json").write_text(json.dumps([earlier]))
    options = ["--data", raw, "--src", "src", "--tgt", "tgt", "--sizes", 200, "--models", "softmax", "--tiny",
               "--max-update", 200]  # fmt: skip
    proc = run([*CONVERGENCE, *options, "--work-dir", work], timeout=600, cwd=REPO)
    # What ran is what its dry run prints: the subset, the quickstart's command, the rows.
    [executed] = assert_run_executed_its_dry_run(CONVERGENCE, options, work)
    assert executed[1].split()[1:3] == ["-m", "examples.quickstart.quickstart"]
    rows = json.loads((work / "convergence.json").read_text())
    assert [(row["pairs"], row["model"]) for row in rows] == [(200, "softmax"), (400, "softmax")]
    row, kept = rows
    assert kept == earlier
    # The subset holds the first 200 training pairs and the whole test set.
    data = work / "200-pairs" / "data"
    assert (data / "train.src").read_text().splitlines() == (raw / "train.src").read_text().splitlines()[:200]
    assert (data / "test.tgt").read_text() == (raw / "test.tgt").read_text()
    # With the cap out of reach, the patience stopped it, 3 epochs after its best.
    assert row["stopped_by_patience"] and row["updates"] < 200
    assert row["epochs"] == row["best_epoch"] + 3
    assert row["best_update"] == row["best_epoch"] * row["updates_per_epoch"]
    assert row["within_1_point_update"] <= row["best_update"]
    assert row["seconds_per_update"] == pytest.approx(row["train_seconds"] / row["updates"])
    # In passes over the training data, at --tiny's batches of 1024 tokens.
    assert row["passes_at_stop"] == pytest.approx(row["updates"] * 1024 / row["batch_tokens_per_pass"])
    summary = json.loads((work / "200-pairs" / "quickstart" / "results.json").read_text())[0]
    assert row["bleu"] == summary["bleu"] and summary["updates"] == row["updates"]
    table_row = next(line for line in proc.stdout.splitlines() if line.startswith("| 200 | "))
    assert f"| {row['updates']} ({row['epochs']}) |" in table_row


def test_a_size_beyond_the_corpus_is_refused_before_any_run(tmp_path):
    raw = write_tiny_corpus(tmp_path / "raw")
    proc = run(
        [*CONVERGENCE, "--data", raw, "--src", "src", "--tgt", "tgt", "--sizes", 200, 5000, "--work-dir",
         tmp_path / "work"],
        check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"--sizes 5000: {raw} has 400 training pairs" in proc.stdout + proc.stderr
    assert not (tmp_path / "work").exists()
