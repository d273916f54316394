"""What the in-model benchmarks give a user on their inputs: normalizers_in_model times a
trained model's batches with the working tree's normalizers against a commit's (here the
commit checked out, so the ratios are the noise about 1), and refuses a test set too small
for its batches with one line; the training benchmark refuses a work folder that holds an
earlier run before it writes anything."""

import re
import sys
from pathlib import Path

import pytest

from helpers import run

ROOT = Path(__file__).resolve().parents[1]
SHARED_TED = ROOT.parent / "shared" / "data" / "iwslt16_de_en_sample"


def benchmark(program, measurement, *arguments):
    return run([sys.executable, "-m", f"benchmarks.{program}", measurement, *arguments], check=False, cwd=ROOT)


def in_model(model, *arguments):
    """normalizers_in_model on a tiny trained model against HEAD, one round of short batches."""
    return benchmark(
        "maps", "in-model", model.data_bin, "--path", model.checkpoint, "--against", "HEAD",
        "--max-tokens", 256, "--gen-len", 4, "--rounds", 1, *arguments,
    )  # fmt: skip


@pytest.mark.slow
def test_normalizers_in_model_compares_a_commit_on_the_same_batches(trained_model):
    alpha = trained_model("alpha_entmax")
    proc = in_model(alpha, "--train-batches", 2, "--gen-batches", 1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "normalizers: ['alpha_entmax']" in proc.stdout
    # One line per kind of step, each with the total ratio and the median of per-batch ratios.
    ratios = re.findall(r"working tree / HEAD: total ([\d.]+), median of (\d+) per-batch ratios ([\d.]+)", proc.stdout)
    assert [batches for _, batches, _ in ratios] == ["2", "1"], proc.stdout
    assert all(float(total) > 0 and float(median) > 0 for total, _, median in ratios)


@pytest.mark.slow
def test_normalizers_in_model_refuses_more_test_batches_than_the_test_set_makes(trained_model):
    alpha = trained_model("alpha_entmax")
    proc = in_model(alpha, "--train-batches", 1, "--gen-batches", 50)
    assert proc.returncode == 1
    # The tiny test set: 40 sentences, 3 batches of 16, of which the first is not timed.
    assert proc.stderr.strip().splitlines()[-1] == (
        "--gen-batches 50: the test set makes 2 batches of 16 sentences after the first, which is not timed"
    )


def test_training_benchmark_refuses_a_work_dir_with_an_earlier_run(tmp_path):
    work = tmp_path / "work"
    (work / "tiny" / "bin").mkdir(parents=True)
    (work / "tiny" / "bin" / "dict.de.txt").write_text("earlier 1\n")
    proc = benchmark("translation", "training", "--data", SHARED_TED, "--settings", "tiny", "--work-dir", work)
    assert proc.returncode == 2
    message = proc.stderr.strip().splitlines()[-1]
    assert message.endswith(f"error: --work-dir {work} holds an earlier run: give an empty or new folder, or remove it")
    assert sorted(path.relative_to(work).as_posix() for path in work.rglob("*")) == [
        "tiny",
        "tiny/bin",
        "tiny/bin/dict.de.txt",
    ]
