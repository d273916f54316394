"""What `make gpu-check` (python -m benchmarks.gpu_check) gives its user: without a CUDA device it
stops at once, exit status 2, saying so and what it would have run; a run (here at tiny size on
the CPU, --cpu-tiny) writes one report, Markdown and JSON, with each step's outcome and figures,
and a step that fails is recorded while the ones after it still run."""

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = [sys.executable, "-m", "benchmarks.gpu_check"]


def without_cuda(**variables):
    """The environment of a process that sees no CUDA device, on any machine."""
    return dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT), **variables)


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
    listed = re.findall(r"^\s+\d+\. ([\w-]+): .+ \(at most \d+ s\)$", proc.stderr, flags=re.M)
    assert listed == list(gpu_check.STEPS)
    assert (
        "python -m pytest -m cuda tests" in proc.stderr
        and "benchmarks.translation training --device cuda" in proc.stderr
    )
    assert not out.exists(), "it wrote a report of steps it did not run"


# Runs the normalizer benchmark and a pytest that fails at once.
@pytest.mark.slow
def test_cpu_tiny_run_reports_its_steps_and_records_a_failure_without_stopping(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for language in ("de", "en"):
        (data / f"train.{language}").write_text("ein satz\n" * 10)
    out = tmp_path / "out"
    steps = ["cuda-tests", "normalizers-float32"]
    # The cuda-tests step fails: pytest refuses an unknown option (only that step runs pytest).
    proc = subprocess.run(
        [*GPU_CHECK, "--cpu-tiny", "--data", data, "--out", out, "--steps", *steps],
        capture_output=True,
        text=True,
        timeout=300,
        env=without_cuda(PYTEST_ADDOPTS="--no-such-option"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    records = {record["step"]: record for record in report["steps"]}
    assert list(records) == list(gpu_check.STEPS)
    assert report["mode"] == "cpu-tiny" and report["verdict"] == "failed: cuda-tests"
    assert "no-such-option" in records["cuda-tests"]["output"]
    assert all(records[name]["status"] == "not run" for name in gpu_check.STEPS if name not in steps)
    assert report["environment"]["torch"] and report["environment"]["fairseq"]

    normalizers = records["normalizers-float32"]
    assert normalizers["status"] == "ok" and normalizers["result"]["dtype"] == "float32"
    assert {"softmax", "sparsemax", "entmax15", "torch.softmax"} <= {
        row["normalizer"] for row in normalizers["result"]["rows"]
    }
    assert all(row["ours_ms"] > 0 for row in normalizers["result"]["rows"])

    markdown = (out / "gpu-check.md").read_text()
    assert "Verdict: failed: cuda-tests" in markdown
    assert "| cuda-tests | failed |" in markdown and "| normalizers-float32 | ok |" in markdown
    assert "| 16x8x8 | sparsemax |" in markdown and "| 16x8x8 | sparsemax |" in proc.stdout
    # The help lists the steps the report gives, in their order.
    with pytest.raises(SystemExit):
        gpu_check.build_parser().parse_args(["--help"])
    listed = re.findall(r"^\s+\d+\. ([\w-]+): .+ \(at most \d+ s\)$", capsys.readouterr().out, flags=re.M)
    assert listed == list(records)


def test_the_test_step_reports_each_outcome_and_names_the_failures(tmp_path):
    """The cuda-tests step's summary of pytest's JUnit XML."""
    suite = ElementTree.Element("testsuite")
    for name, outcome in [
        ("test_cuda_agrees_with_cpu[float32-softmax]", None),
        ("test_no_host_synchronisation_on_cuda[entmax15]", "failure"),
        ("test_alpha_given_on_the_cpu[cuda]", "skipped"),
        ("test_alpha_given_on_the_cpu[cpu]", "error"),
    ]:
        case = ElementTree.SubElement(suite, "testcase", classname="tests.test_normalizers_cuda", name=name)
        if outcome:
            ElementTree.SubElement(case, outcome)
    path = tmp_path / "junit.xml"
    ElementTree.ElementTree(suite).write(path)
    summary = gpu_check.read_junit(path)
    assert summary["counts"] == {"passed": 1, "failed": 1, "skipped": 1, "error": 1}
    assert summary["failed"] == [
        "tests.test_normalizers_cuda::test_alpha_given_on_the_cpu[cpu]",
        "tests.test_normalizers_cuda::test_no_host_synchronisation_on_cuda[entmax15]",
    ]
