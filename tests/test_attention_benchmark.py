"""benchmarks/attention.py as a user runs it: every row of its table, its JSON, and the
refusal of a pass that does not fit the memory limit."""

import json
import sys

import pytest

from benchmarks.attention import measure, rows
from benchmarks.fresh_process import call_in_fresh_process
from fairseq_entmax.names import NORMALIZER_NAMES
from helpers import run

pytestmark = pytest.mark.slow


def test_the_raw_table_has_every_normalizer_on_both_paths(tmp_path):
    out = tmp_path / "attention.json"
    finished = run(
        [sys.executable, "-m", "benchmarks.attention", "--settings", "raw", "--tokens", "64"]
        + ["--causal", "causal", "--json", str(out)]
    )
    report = json.loads(out.read_text())
    measured = {(r["path"], r["normalizer"]) for r in report["results"]}
    assert (
        measured
        == set(rows("raw"))
        == {("sdpa", "softmax")} | {(path, name) for name in NORMALIZER_NAMES for path in ("blocked", "materialized")}
    )
    assert all(r["seconds"] > 0 and r["peak_mib"] >= 0 and r["tokens"] == 64 for r in report["results"])
    assert "raw, 64 tokens, causal" in finished.stdout and "| blocked | alpha_entmax |" in finished.stdout


def test_a_pass_beyond_the_memory_limit_is_reported_not_raised():
    """The materialized path at 4,096 tokens holds 8 x 4,096^2 float32 scores (512 MiB) and more."""
    result = call_in_fresh_process(measure, "raw", "materialized", "softmax", 4096, False, "cpu", 1, 1.5)
    assert result == {"refused": "out of memory within 1.5 GiB"}


def test_the_short_setting_forces_the_blocks_beside_the_functions_choice():
    """At translation lengths the function computes a call whole; the "blocks" row measures the
    blocks (block_queries given) on the same batch."""
    assert set(rows("short")) == {("sdpa", "softmax")} | {
        (path, name) for name in NORMALIZER_NAMES for path in ("blocked", "blocks", "materialized")
    }
    result = call_in_fresh_process(measure, "short", "blocks", "alpha_entmax", 64, False, "cpu", 1, 4.0)
    assert result["seconds"] > 0 and result["peak_mib"] >= 0


def test_the_clustered_table_gives_each_normalizers_zero_key_blocks(tmp_path):
    """On the clustered pattern (local keys and 4 seen from everywhere) the sparse maps leave most
    key blocks at 1,024 tokens without weight; softmax none."""
    out = tmp_path / "clustered.json"
    finished = run(
        [sys.executable, "-m", "benchmarks.attention", "--settings", "clustered", "--tokens", "1024"]
        + ["--skip-materialized-above", "0", "--json", str(out)]
    )
    results = json.loads(out.read_text())["results"]
    sparsity = {r["normalizer"]: r["zero_key_blocks"] for r in results if r["path"] == "blocked"}
    assert set(sparsity) == set(NORMALIZER_NAMES)
    assert sparsity["softmax"] == 0 and min(sparsity[name] for name in ("sparsemax", "entmax15", "topk")) > 0.6
    assert [r["path"] for r in results] == ["sdpa"] + ["blocked"] * len(NORMALIZER_NAMES)
    assert "clustered, 1,024 tokens, causal" in finished.stdout and "zero key blocks: softmax 0.00" in finished.stdout


def test_rounds_measure_the_rows_in_turn_and_keep_the_medians(tmp_path, monkeypatch):
    """--rounds 3: every row three times, the rows in turn (A, B, A, B, ...), the median of each
    row's seconds and peak memory reported."""
    import benchmarks.attention as attention

    calls = []

    def fake_pass(function, setting, path, name, *rest):
        calls.append((path, name))
        seconds = [1.0, 2.0, 6.0][sum(call == (path, name) for call in calls) - 1]
        return {"seconds": seconds * (2 if path == "blocked" else 1), "peak_mib": 10.0 * len(calls)}

    monkeypatch.setattr(attention, "call_in_fresh_process", fake_pass)
    out = tmp_path / "attention.json"
    assert attention.main(["--settings", "step", "--tokens", "64", "--rounds", "3", "--json", str(out)]) == 0
    table = rows("step")
    assert calls == table * 3
    report = json.loads(out.read_text())["results"]
    assert [(r["path"], r["normalizer"]) for r in report] == table
    assert [r["seconds"] for r in report] == [4.0 if path == "blocked" else 2.0 for path, _ in table]
    assert report[0]["peak_mib"] == 10.0 * (1 + len(table))
    assert attention.main(["--rounds", "0"]) == 2
