"""What python -m benchmarks.huggingface gives its user, at --size tiny: every implementation of both
families timed in interleaved rounds, medians and ratios against eager, the peak memory, and
the JSON report; bad arguments refused with a one-line error. Never the speeds themselves."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

# Builds and times twelve models and runs the profiler: over 20 seconds on 2 cores.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ("eager", "sdpa", "sparsemax", "entmax15", "topk", "alpha_entmax")
FAMILIES = ("marian", "llama")


def benchmark(*arguments):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.huggingface", *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    report = tmp_path_factory.mktemp("hf_benchmark") / "report.json"
    proc = benchmark("--size", "tiny", "--rounds", 2, "--json", report)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(report.read_text())


def test_json_has_every_family_and_implementation_with_interleaved_rounds(tiny_report):
    _, report = tiny_report
    assert report["size"] == "tiny" and report["device"] == "cpu" and report["rounds"] == 2 and report["batch"] == 2
    assert "threads" in report["machine"]
    assert tuple(report["results"]) == FAMILIES
    for rows in report["results"].values():
        assert tuple(rows) == IMPLEMENTATIONS
        eager = rows["eager"]
        for row in rows.values():
            assert len(row["train_rounds"]) == len(row["generate_rounds"]) == 2
            assert all(seconds > 0 for seconds in row["train_rounds"] + row["generate_rounds"])
            assert row["train_s"] == pytest.approx(statistics.median(row["train_rounds"]), rel=1e-12)
            assert row["generate_s"] == pytest.approx(statistics.median(row["generate_rounds"]), rel=1e-12)
            assert row["peak_bytes"] > 0
            assert row["train_ratio"] == pytest.approx(row["train_s"] / eager["train_s"], rel=1e-12)
            assert row["generate_ratio"] == pytest.approx(row["generate_s"] / eager["generate_s"], rel=1e-12)
            assert row["memory_ratio"] == pytest.approx(row["peak_bytes"] / eager["peak_bytes"], rel=1e-12)
        assert eager["train_ratio"] == eager["generate_ratio"] == eager["memory_ratio"] == 1.0


def test_table_prints_one_row_per_family_and_implementation(tiny_report):
    stdout, report = tiny_report
    rows = [line for line in stdout.splitlines() if line.startswith("| marian |") or line.startswith("| llama |")]
    assert [tuple(cell.strip() for cell in line.split("|")[1:3]) for line in rows] == [
        (family, name) for family in FAMILIES for name in IMPLEMENTATIONS
    ]
    assert report["machine"] in stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--rounds", 0), "--rounds must be at least 1"),
        (("--batch", 0), "--batch must be at least 1"),
        (("--device", "tpu"), "--device must be cpu or cuda"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(arguments, message, capsys):
    """In this process: the command's main, as its entry point calls it, stops in its parser."""
    from benchmarks import huggingface

    with pytest.raises(SystemExit) as stopped:
        huggingface.main(["--size", "tiny", *map(str, arguments)])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
