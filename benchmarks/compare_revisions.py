"""The normalizer benchmark for the working tree against another commit, side by side.

Runs the normalizer benchmark (this tree's module, our normalizers only, no memory columns)
in fresh processes that import fairseq_entmax alternately from the working tree and from REF
(exported with `git archive` into a temporary folder). Each round of processes runs both, in an
order that alternates from round to round, so that the machine's drift falls on both alike.
Prints, per shape and normalizer, the median milliseconds of each and the ratio working tree /
REF (the median over rounds, with its range): below 1, the working tree is faster.

Run before a change to a normalizer lands (`make bench-compare REF=<commit>`):
    python -m benchmarks.maps against REF [--process-rounds 3] [--rounds 7] [--threads 2]
        [--shapes 128x128x128 32x512x512] [--clock {wall,cpu}] [--max-ratio 1.10]
With --max-ratio, the exit status is 1 when a normalizer's median ratio exceeds it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import run_record
from benchmarks.revisions import REPOSITORY, export, git

# The normalizer benchmark of this tree, as a command.
BENCHMARK = ("-m", "benchmarks.maps", "normalizers")
DEFAULT_SHAPES = ["128x128x128", "32x512x512"]


def run_benchmark(package_root, shapes, rounds, threads, clock, output):
    """One fresh process of the normalizer benchmark importing fairseq_entmax from package_root.

    Args: package_root: the folder that holds the fairseq_entmax package to measure; shapes: shape strings,
    e.g. "128x128x128"; rounds: timed rounds inside the process; threads: torch's CPU threads; clock: "wall"
    or "cpu" (normalizers.py --clock); output: the JSON file the benchmark writes.
    Returns: {(shape, normalizer): our median milliseconds}.
    Raises SystemExit: the process failed or imported fairseq_entmax from elsewhere.
    """
    # Run from package_root: `python -c` and `-m` put the current folder before PYTHONPATH.
    # REPOSITORY after it: this tree's benchmarks package, which REF's export does not hold.
    env = {"PYTHONPATH": os.pathsep.join([str(package_root), str(REPOSITORY)])}
    where = subprocess.run(
        [sys.executable, "-c", "import fairseq_entmax; print(fairseq_entmax.__file__)"],
        env=dict(os.environ, **env),
        cwd=package_root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(Path(package_root).resolve()):
        raise SystemExit(f"error: fairseq_entmax imports from {where!r}, not from {package_root}")
    command = [sys.executable, *BENCHMARK, "--ours-only", "--no-memory", "--json", str(output)]
    command += ["--rounds", str(rounds), "--threads", str(threads), "--clock", clock, "--shapes", *shapes]
    done = subprocess.run(command, env=dict(os.environ, **env), cwd=package_root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    rows = json.loads(Path(output).read_text())["rows"]
    return {("x".join(map(str, row["shape"])), row["normalizer"]): row["ours_ms"] for row in rows}


def compare(ref, shapes, process_rounds, rounds, threads, clock):
    """Alternate the working tree's and REF's benchmark processes over process_rounds.

    Returns: (commit, tree_times, ref_times): REF's commit and, for each, {(shape, normalizer): [median
    milliseconds of each round]}.
    """
    tree_times, ref_times = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as scratch:
        ref_root = Path(scratch) / "ref"
        ref_root.mkdir()
        commit = export(ref, "fairseq_entmax", ref_root)
        sides = [("working tree", REPOSITORY, tree_times), (commit[:9], ref_root, ref_times)]
        for round_index in range(process_rounds):
            for label, root, times in sides if round_index % 2 == 0 else sides[::-1]:
                print(f"round {round_index + 1}/{process_rounds}: {label}", file=sys.stderr, flush=True)
                measured = run_benchmark(root, shapes, rounds, threads, clock, Path(scratch) / "result.json")
                for key, milliseconds in measured.items():
                    times.setdefault(key, []).append(milliseconds)
    return commit, tree_times, ref_times


def ratio_rows(tree_times, ref_times):
    """Per (shape, normalizer): medians and the per-round ratios tree / REF.

    Returns: A list of (shape, normalizer, tree median ms, REF median ms, median ratio, min ratio, max ratio),
    in the benchmark's order.
    """
    rows = []
    for key, tree in tree_times.items():
        ratios = [t / r for t, r in zip(tree, ref_times[key])]
        rows.append(
            (*key, statistics.median(tree), statistics.median(ref_times[key]), statistics.median(ratios))
            + (min(ratios), max(ratios))
        )
    return rows


def main(argv=None):
    """The command line (see the top); prints the table and returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ref", help="the commit to compare the working tree with")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="batch*heads x queries x keys")
    parser.add_argument("--process-rounds", type=int, default=3, help="fresh processes per side (default 3)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds in each process (default 7)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time (default) or CPU time, steadier on a shared machine at --threads 1",
    )
    parser.add_argument("--max-ratio", type=float, default=None, help="exit 1 when a median ratio exceeds it")
    args = parser.parse_args(argv)
    if args.process_rounds < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--process-rounds, --rounds and --threads take a whole number of 1 or more")
    commit, tree_times, ref_times = compare(
        args.ref, args.shapes, args.process_rounds, args.rounds, args.threads, args.clock
    )
    run_record()
    changed = " + changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    print(f"working tree ({git('rev-parse', '--short', 'HEAD')}{changed}) against {commit[:9]} ({args.ref})")
    print(
        f"forward+backward, float32, early-exit path, {args.threads} threads, {args.clock} time; median of "
        f"{args.rounds} rounds per process, {args.process_rounds} processes per side, alternating; "
        "ratio < 1: the working tree is faster"
    )
    print("| shape | normalizer | tree ms | ref ms | tree / ref [range] |")
    print("|---|---|---|---|---|")
    too_slow = []
    for shape, name, tree_ms, ref_ms, ratio, low, high in ratio_rows(tree_times, ref_times):
        print(f"| {shape} | {name} | {tree_ms:.2f} | {ref_ms:.2f} | {ratio:.3f} [{low:.3f}, {high:.3f}] |")
        if args.max_ratio is not None and ratio > args.max_ratio:
            too_slow.append(f"{name} at {shape}: {ratio:.3f}")
    if too_slow:
        print(f"over --max-ratio {args.max_ratio}: " + "; ".join(too_slow))
        return 1
    return 0
