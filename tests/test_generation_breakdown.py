"""What `python -m benchmarks.translation breakdown` gives its user: per checkpoint, one row with
the normalizers it ran, fairseq-generate's wall time, the part spent in the normalizers and
the mean time of a call per attention type; and a missing checkpoint refused before any run."""

import sys
from pathlib import Path

import pytest

from benchmarks.generation_breakdown import generate_command
from helpers import run

ROOT = Path(__file__).resolve().parents[1]

# Runs fairseq-generate.
pytestmark = pytest.mark.slow


def breakdown(*arguments):
    return run([sys.executable, "-m", "benchmarks.translation", "breakdown", *arguments], check=False, cwd=ROOT)


def test_each_checkpoint_gets_a_row_with_its_normalizer_time(trained_model):
    softmax, alpha = trained_model("softmax"), trained_model("alpha_entmax")
    proc = breakdown(softmax.data_bin, "--path", softmax.checkpoint, alpha.checkpoint, "--len", 5)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # stdout is the run's record, then the table: fairseq-generate's log goes to stderr.
    machine, date, commit, command, header, rule, *rows = proc.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in (machine, date, commit, command)] == ["machine", "date", "commit", "command"]
    assert command.endswith(f"breakdown {softmax.data_bin} --path {softmax.checkpoint} {alpha.checkpoint} --len 5")
    assert header.split("|")[1:-1] == [
        " checkpoint ", " normalizer ", " generate s ", " in normalizers s ", " share ",
        " encoder_self ms/call ", " decoder_self ms/call ", " cross ms/call ",
    ]  # fmt: skip
    assert rule.startswith("|---|")
    assert [row.split("|")[1:3] for row in rows] == [
        [f" {softmax.save_dir.name} ", " softmax "],
        [f" {alpha.save_dir.name} ", " alpha_entmax "],
    ]
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        wall, inside, share = float(cells[2]), float(cells[3]), float(cells[4].rstrip("%")) / 100
        # The seconds are printed to 0.005 and the share to 0.5%: the bound of their rounding.
        rounding = 0.005 + 0.005 / wall * (1 + inside / wall)
        assert 0 < inside < wall and share == pytest.approx(inside / wall, abs=rounding)
        # Every attention type ran: encoder and decoder self-attention, and cross attention.
        assert all(float(ms) > 0 for ms in cells[5:])


def test_generation_on_the_cpu_has_no_data_loader_process(tmp_path):
    """fairseq-generate runs in the benchmark's process, where a data-loader process's shutdown
    waited out its 5 s timeout inside the timed run: most of a small run's "generate s"."""
    command = generate_command(tmp_path, tmp_path / "checkpoint.pt", 5, "cpu")
    assert command[command.index("--num-workers") + 1] == "0"
    assert "--num-workers" not in generate_command(tmp_path, tmp_path / "checkpoint.pt", 5, "cuda")


def test_a_missing_checkpoint_is_refused_before_any_run(trained_model, tmp_path):
    softmax = trained_model("softmax")
    proc = breakdown(softmax.data_bin, "--path", softmax.checkpoint, tmp_path / "none.pt")
    assert proc.returncode != 0
    assert f"checkpoint not found: {tmp_path / 'none.pt'}" in proc.stderr
    assert proc.stdout == ""
