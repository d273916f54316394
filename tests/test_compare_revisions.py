"""What `make bench-compare REF=...` (python -m benchmarks.maps against) gives its user: fresh
processes alternating between the working tree and REF, every normalizer's time on both sides
with their ratio, an exit status for a ratio over --max-ratio, and a bad REF refused in one line."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
NORMALIZERS = ["torch.softmax", "softmax", "sparsemax", "entmax15", "alpha_entmax", "topk_softmax"]

# Starts four Python processes that import torch.
pytestmark = pytest.mark.slow


def compare(*arguments):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.maps", "against", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPOSITORY,
    )


def test_both_sides_alternate_and_every_normalizer_gets_a_ratio():
    head = subprocess.run(
        ["git", "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True, cwd=REPOSITORY, check=True
    ).stdout.strip()
    proc = compare("HEAD", "--shapes", "16x4x32", "--process-rounds", "2", "--rounds", "1", "--threads", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = re.findall(r"^round (\d)/2: (.+)$", proc.stderr, re.MULTILINE)
    # The order alternates, so that a drift of the machine falls on both sides alike.
    assert order == [("1", "working tree"), ("1", head), ("2", head), ("2", "working tree")]

    # The header names the commit under the working tree, and says whether tracked files differ.
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPOSITORY).stdout.strip()

    changes = " + changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    assert f"working tree ({git('rev-parse', '--short', 'HEAD')}{changes}) against {head} (HEAD)" in proc.stdout
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| 16x4x32 |")]
    assert [row[1].split(" (")[0] for row in rows] == NORMALIZERS
    for row in rows:
        tree_ms, ref_ms = float(row[2]), float(row[3])
        ratio, low, high = map(float, re.match(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", row[4]).groups())
        assert tree_ms > 0 and ref_ms > 0 and low <= ratio <= high


def test_a_ratio_over_the_limit_gives_exit_status_1():
    proc = compare("HEAD", "--shapes", "8x2x16", "--process-rounds", "1", "--rounds", "1", "--max-ratio", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "over --max-ratio 0.0: torch.softmax at 8x2x16" in proc.stdout


def test_a_ref_that_is_no_commit_is_refused_in_one_line():
    proc = compare("no-such-commit")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: 'no-such-commit' is not a commit of this repository (see git log)"
