"""What `make gpu-check` (python -m benchmarks.gpu_check) gives its user: without a CUDA device it
stops at once, exit status 2, saying so and what it would have run; a run of every step (here
at tiny size on the CPU, --cpu-tiny) writes one report, Markdown and JSON, with each step's
outcome and figures, and a step that fails is recorded while the ones after it still run."""

import json
import os
import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = [sys.executable, "-m", "benchmarks.gpu_check"]
# The steps as the check declares them, in their order.
STEPS = [step.name for step in gpu_check.STEPS]


def without_cuda():
    """The environment of a process that sees no CUDA device, on any machine."""
    return dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))


def write_corpus(directory, lines=420, seed=0):
    """A line-aligned train.de / train.en pair: each English line the German one word by word
    through a fixed dictionary."""
    rng = random.Random(seed)
    german = [f"wort{i}" for i in range(40)]
    directory.mkdir(parents=True)
    de, en = [], []
    for _ in range(lines):
        words = [rng.choice(german) for _ in range(rng.randint(3, 12))]
        de.append(" ".join(words))
        en.append(" ".join(word.replace("wort", "word") for word in words))
    (directory / "train.de").write_text("\n".join(de) + "\n")
    (directory / "train.en").write_text("\n".join(en) + "\n")
    return directory


# Runs a fresh Python that imports torch.
@pytest.mark.slow
def test_without_cuda_it_stops_at_once_with_status_2_and_says_what_it_would_run(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [*GPU_CHECK, "--out", out, "--data", tmp_path / "absent"],
        capture_output=True,
        text=True,
        timeout=120,
        env=without_cuda(),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device was found" in proc.stderr
    for step in STEPS[1:]:
        assert f"{step}:" in proc.stderr, step
    assert "benchmarks.training --device cuda" in proc.stderr and "--fp16" in proc.stderr
    assert not out.exists(), "it wrote a report of steps it did not run"


# Runs fairseq-train, -generate and -interactive at tiny size.
@pytest.mark.slow
def test_cpu_tiny_run_reports_every_step_and_records_a_failure_without_stopping(tmp_path, capsys):
    data = write_corpus(tmp_path / "data")
    out = tmp_path / "out"
    # The cuda-tests step fails: pytest refuses an unknown option (only that step runs pytest).
    env = dict(without_cuda(), PYTEST_ADDOPTS="--no-such-option")
    proc = subprocess.run(
        [*GPU_CHECK, "--cpu-tiny", "--data", data, "--out", out, "--work-dir", tmp_path / "work"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    steps = {record["step"]: record for record in report["steps"]}
    assert [record["step"] for record in report["steps"]] == STEPS
    # The help lists what a run does: the steps it reports, in their order, each with a limit.
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--help"])
    listed = re.findall(r"^\s+\d+\. ([\w-]+): .+ \(at most \d+ s\)$", capsys.readouterr().out, flags=re.M)
    assert listed == [record["step"] for record in report["steps"]]
    assert report["mode"] == "cpu-tiny" and report["verdict"] == "failed: cuda-tests"
    assert "no-such-option" in steps["cuda-tests"]["error"]
    assert all(steps[step]["status"] == "skipped" and steps[step]["error"] for step in gpu_check.TINY.skip)
    assert all(steps[step]["status"] == "ok" for step in STEPS if step not in ("cuda-tests", *gpu_check.TINY.skip)), {
        step: steps[step].get("error") for step in STEPS
    }

    assert set(steps["huggingface"]["result"]["results"]) == {"marian", "llama"}
    environment = steps["environment"]["result"]
    assert environment["torch"] and environment["fairseq"] and environment["cuda_available"] is False
    layer = steps["attention-sync"]["result"]
    for normalizer in ("softmax", "sparsemax", "entmax15", "alpha_entmax", "topk"):
        for dtype in ("float32", "float16"):
            cases = [case for case in layer if case.startswith(f"{normalizer} ") and case.endswith(dtype)]
            assert cases, (normalizer, dtype)
    for dtype in ("float32", "bfloat16", "float16"):
        result = steps[f"normalizers-{dtype}"]["result"]
        assert result["dtype"] == dtype
        names = {row["normalizer"] for row in result["rows"]}
        assert {"softmax", "sparsemax", "entmax15", "torch.softmax"} <= names
        assert all(row["ours_ms"] > 0 and row["ours_over_softmax"] > 0 for row in result["rows"])
    round_trip = steps["round-trip"]["result"]
    assert round_trip["generate_sentences"] == 32 and round_trip["interactive_translated"] == 3
    models = steps["training"]["result"]["settings"]["tiny"]["models"]
    baseline, topk = models["transformer"], models["topk"]
    assert baseline["label"] == "softmax (fairseq transformer)" and topk["label"] == "top-k (k=8)"
    assert baseline["train_words_per_s_ratio"] == 1.0 and baseline["peak_memory_ratio"] == 1.0
    assert topk["train_words_per_s"] > 0 and topk["train_words_per_s_ratio"] > 0 and topk["peak_memory_mib"] > 0

    markdown = (out / "gpu-check.md").read_text()
    assert "Verdict: failed: cuda-tests" in markdown
    assert "| cuda-tests | failed |" in markdown and "| training | ok |" in markdown
    assert "| top-k (k=8) |" in markdown and "| training-compiled | skipped |" in markdown
    assert "| top-k (k=8) |" in proc.stdout, "the report is not printed"
    assert (out / "gpu-check-logs.tar.gz").stat().st_size > 0


def test_report_gives_each_tests_outcome_and_each_normalizers_sync_verdict(tmp_path):
    """The cuda-tests step's summary of pytest's JUnit XML: outcomes counted, failures named,
    the no-host-sync test of each normalizer read out."""
    suite = ElementTree.Element("testsuite")
    for name, outcome in [
        ("test_cuda_agrees_with_cpu[float32-softmax]", None),
        ("test_no_host_synchronisation_on_cuda[softmax]", None),
        ("test_no_host_synchronisation_on_cuda[entmax15]", "failure"),
        ("test_alpha_given_on_the_cpu[cuda]", "skipped"),
        ("test_alpha_given_on_the_cpu[cpu]", "error"),
    ]:
        case = ElementTree.SubElement(suite, "testcase", name=name)
        if outcome:
            ElementTree.SubElement(case, outcome)
    path = tmp_path / "junit.xml"
    ElementTree.ElementTree(suite).write(path)
    summary = gpu_check.summarise_tests(gpu_check.read_junit(path))
    assert summary["counts"] == {"passed": 2, "failed": 1, "skipped": 1, "error": 1}
    assert summary["failed"] == ["test_alpha_given_on_the_cpu[cpu]", "test_no_host_synchronisation_on_cuda[entmax15]"]
    assert summary["no_host_sync"] == {"softmax": "passed", "entmax15": "failed"}
