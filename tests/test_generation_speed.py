"""What `python -m benchmarks.translation generation` gives its user: the models' fairseq-generate runs
interleaved over rounds, each model's median sentences/s and tokens/s with its ratio to the
baseline, the figures of every round in the JSON; and a bad model argument refused before any
translation, saying what to give."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Runs fairseq-generate.
pytestmark = pytest.mark.slow


def speed(*arguments):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.translation", "generation", *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def test_models_translate_the_same_test_set_in_interleaved_rounds(trained_model, tmp_path):
    softmax, topk = trained_model("softmax"), trained_model("topk")
    report = tmp_path / "speed.json"
    proc = speed(
        "--data-bin", softmax.data_bin, "--rounds", 2, "--json", report,
        f"softmax={softmax.checkpoint}", f"topk={topk.checkpoint}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(report.read_text())
    # Rounds interleave the models: softmax, topk, softmax, topk.
    order = [line.split()[2].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert order == ["softmax", "topk", "softmax", "topk"]
    test_sentences = sum(1 for _ in open(softmax.data_bin.parent / "raw" / "test.src", encoding="utf-8"))
    for name in ("softmax", "topk"):
        rounds = record["rounds"][name]
        assert len(rounds) == 2 and all(sentences == test_sentences for sentences, _, _ in rounds)
        assert record["median"][name]["sentences_per_s"] == pytest.approx(
            statistics.median(sentences / seconds for sentences, _, seconds in rounds)
        )
    ratio = record["median"]["topk"]["sentences_per_s"] / record["median"]["softmax"]["sentences_per_s"]
    [softmax_row] = [line for line in proc.stdout.splitlines() if line.startswith("| softmax |")]
    [topk_row] = [line for line in proc.stdout.splitlines() if line.startswith("| topk |")]
    assert softmax_row.split("|")[3].strip() == "1.00" and topk_row.split("|")[3].strip() == f"{ratio:.2f}"
    assert "beam 5" in proc.stdout and "median of 2 interleaved rounds" in proc.stdout


@pytest.mark.parametrize(
    "models,message",
    [
        (["topk"], "give a model as NAME=CHECKPOINT"),
        (["topk=/nonexistent/checkpoint.pt"], "no checkpoint at /nonexistent/checkpoint.pt"),
    ],
)
def test_a_bad_model_argument_is_refused_before_translating(tmp_path, models, message):
    proc = speed("--data-bin", tmp_path, *models)
    assert proc.returncode == 2 and message in proc.stderr and "round 1" not in proc.stdout


def test_the_same_name_twice_is_refused(trained_model):
    model = trained_model("softmax")
    proc = speed("--data-bin", model.data_bin, f"a={model.checkpoint}", f"a={model.checkpoint}")
    assert proc.returncode == 2 and "model names must differ" in proc.stderr


def test_a_run_fairseq_times_as_0_0_s_is_timed_by_its_rate():
    """fairseq prints the time to 0.1 s, a fast run's as 0.0 s, and the rate from the exact time:
    the benchmark takes a run's seconds from its rate (a tiny model on a fast CPU divided by 0)."""
    from benchmarks.generation_speed import TRANSLATED

    line = "Translated 1,040 sentences (6,245 tokens) in 0.0s (20800.00 sentences/s, 124900.00 tokens/s)"
    assert TRANSLATED.search(line).groups() == ("1,040", "6,245", "20800.00")
