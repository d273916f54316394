"""benchmarks/attention.py as a user runs it: every row of its table, its JSON, and the
refusal of a pass that does not fit the memory limit; the captured setting's model, trained once
and read back, and its zero key blocks per head against the whole maps."""

import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import captured_attention
from benchmarks.attention import _patterned_inputs, block_sparsity, clustered_inputs, measure, rows
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


def test_the_dry_run_lists_each_table_and_measures_nothing(monkeypatch, capsys):
    """--dry-run: after the checks, one line per table with its rounds and rows, the
    materialized rows left out above --skip-materialized-above; no pass runs."""
    import benchmarks.attention as attention

    monkeypatch.setattr(attention, "call_in_fresh_process", lambda *args: pytest.fail("a pass ran"))
    options = ["--settings", "raw", "step", "--tokens", "1024", "4096", "--causal", "causal"]
    assert attention.main([*options, "--rounds", "2", "--skip-materialized-above", "1024", "--dry-run"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " round(s) of " in line]
    titles = ["raw, 1,024 tokens, causal", "raw, 4,096 tokens, causal"]
    titles += ["step, 1,024 tokens, one query", "step, 4,096 tokens, one query"]
    assert [line.split(": ")[0] for line in lines] == titles
    assert lines[0] == titles[0] + ": 2 round(s) of " + ", ".join(f"{path} {name}" for path, name in rows("raw"))
    assert "materialized" not in lines[1] and "blocked alpha_entmax" in lines[1]
    assert attention.main(["--rounds", "0", "--dry-run"]) == 2


TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "iwslt16_de_en_sample" / "train.en"
needs_text = pytest.mark.requires(TEXT.exists(), f"the captured setting trains on {TEXT}, absent here")


@pytest.fixture
def small_capture(tmp_path, monkeypatch):
    """A capture of 256 bytes from a byte model trained 3 updates of 2 x 64 bytes on the first
    3,000 lines of the IWSLT16 sample's English side; and the training's log."""
    monkeypatch.setattr(captured_attention, "STEPS", 3)
    monkeypatch.setattr(captured_attention, "CONTEXT", 64)
    monkeypatch.setattr(captured_attention, "BATCH", 2)
    text = tmp_path / "ted.en"
    text.write_text("\n".join(TEXT.read_text(encoding="utf-8").splitlines()[:3000]) + "\n", encoding="utf-8")
    log = []
    path = tmp_path / "capture.pt"
    saved = captured_attention.capture(text, 256, path, log=log.append)
    return text, path, saved, log


@needs_text
def test_a_capture_is_trained_once_and_read_back(small_capture):
    text, path, saved, log = small_capture
    assert [saved[name].shape for name in ("query", "key", "value")] == [(1, 8, 256, 64)] * 3
    assert all(torch.isfinite(saved[name]).all() for name in ("query", "key", "value"))
    assert log[0].startswith("captured: training") and "3 updates of 2 x 64 bytes" in log[0]
    assert log[-1].startswith("  update 3/3: ") and "bits per byte" in log[-1]
    # Each head's alpha is that of its logit, and learning moved it from its start at 1.5.
    assert torch.allclose(saved["alpha"], 1 + torch.sigmoid(saved["alpha_logit"]))
    assert saved["alpha"].shape == (8,) and (saved["alpha"] != 1.5).all()
    again = []
    reread = captured_attention.capture(text, 256, path, log=again.append)
    assert not again and torch.equal(reread["query"], saved["query"])
    # Another length: the same model, not trained again, on the window's first 128 bytes (a
    # causal model's queries, keys and values there depend on those alone).
    shorter = captured_attention.capture(text, 128, path.with_name("capture-128.pt"), log=again.append)
    assert not again and torch.equal(shorter["alpha"], saved["alpha"])
    for name in ("query", "key", "value"):
        assert torch.allclose(shorter[name], saved[name][..., :128, :], atol=1e-5)


@pytest.fixture
def clustered_capture(tmp_path):
    """A capture file holding the clustered inputs of 256 tokens, heads at alphas 1.1 to 1.8."""
    query, key, value = (tensor.detach() for tensor in clustered_inputs(256))
    alpha = torch.linspace(1.1, 1.8, 8)
    path = tmp_path / "clustered.pt"
    alpha_logit = torch.logit(alpha - 1)
    torch.save({"query": query, "key": key, "value": value, "alpha_logit": alpha_logit, "alpha": alpha}, path)
    return path, alpha


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_the_zero_key_blocks_of_a_capture_per_head_and_for_all(clustered_capture, name):
    """block_sparsity against the whole 256 x 256 map of each head, causal, by brute force;
    learned alpha-entmax at the capture's alphas."""
    path, alpha = clustered_capture
    query, key, _, normalizer = _patterned_inputs(name, 256, "cpu", path)
    if name == "alpha_entmax":
        assert torch.allclose(normalizer.head_alpha(), alpha)
    scores = (query @ key.transpose(-1, -2) / 8).detach()[0]
    weights = normalizer(scores.masked_fill(torch.ones(256, 256, dtype=torch.bool).triu(1), float("-inf")))
    # (heads, query block, key block): any weight there; the visible blocks are those on or below
    # the diagonal, of 64 queries by 64 keys.
    weighed = (weights != 0).view(8, 4, 64, 4, 64).any(dim=4).any(dim=2)
    visible = torch.ones(4, 4, dtype=torch.bool).tril()
    per_head = [float((~weighed[h] & visible).sum() / visible.sum()) for h in range(8)]
    every_head = float((~weighed.any(dim=0) & visible).sum() / visible.sum())
    all_heads, heads = block_sparsity(name, 256, "cpu", path)
    assert heads == pytest.approx(per_head, abs=1e-6) and all_heads == pytest.approx(every_head, abs=1e-6)
    if name == "softmax":
        assert heads == [0.0] * 8 and all_heads == 0.0
    else:
        # Blocks without weight in some heads; the blocks all heads skip are fewer (none where
        # a head at alpha 1.1 weighs every block).
        assert max(heads) > 0 and all_heads <= min(heads)
        assert all_heads > 0 or name == "alpha_entmax"


@needs_text
def test_a_captured_pass_runs_the_blocked_function_on_the_capture(small_capture):
    _, path, _, _ = small_capture
    result = call_in_fresh_process(measure, "captured", "blocked", "alpha_entmax", 256, True, "cpu", 1, 4.0, path)
    assert result["seconds"] > 0 and result["peak_mib"] >= 0


def test_the_captured_setting_needs_its_text_long_enough(tmp_path, capsys):
    import benchmarks.attention as attention

    assert attention.main(["--settings", "captured", "--text", str(tmp_path / "none.txt")]) == 2
    assert f"{tmp_path / 'none.txt'} is not a file" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("a sentence.\n" * 1000)
    options = ["--settings", "captured", "--text", str(short), "--tokens", "4096", "--capture-dir", str(tmp_path)]
    assert attention.main(options) == 2
    assert f"{short} has 12,000 bytes; a window of 4,096 needs a text of 40,960 at least" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.pt"))
