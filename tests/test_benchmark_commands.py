"""The benchmarks run as modules of the benchmarks package (`python -m benchmarks.NAME`, from
the repository root): five programs, every such command in the Makefile and the Markdown names
one of them and a measurement it has, and none runs a benchmark as a script by its path, which
would not import the package."""

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "Makefile", *ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*")]


PROGRAMS = {"maps", "attention", "translation", "huggingface", "gpu_check"}


def test_five_programs_and_every_command_names_one_and_its_measurement():
    programs = {
        path.stem for path in (ROOT / "benchmarks").glob("*.py") if "__main__" in path.read_text(encoding="utf-8")
    }
    # cuda_peak_memory is the training measurement's wrapper of fairseq-train on a GPU, not a program.
    assert programs - {"cuda_peak_memory"} == PROGRAMS
    measurements = {
        program: importlib.import_module(f"benchmarks.{program}").MEASUREMENTS for program in ("maps", "translation")
    }
    named = {
        (path.name, program, measurement)
        for path in DOCUMENTS
        if path.suffix in ("", ".md", ".py", ".sh")
        for program, measurement in re.findall(
            r"-m benchmarks\.([a-z][a-z0-9_]*)(?: ([a-z][a-z-]*))?", path.read_text(encoding="utf-8")
        )
    }
    assert {program for _, program, _ in named} >= PROGRAMS - {"huggingface"}
    wrong = sorted(
        (document, program, measurement)
        for document, program, measurement in named
        if program not in PROGRAMS | {"cuda_peak_memory"}
        or (program in measurements and measurement and measurement not in measurements[program])
    )
    assert not wrong, wrong


def test_a_program_lists_its_measurements_and_refuses_an_unknown_one():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.maps", "nothing"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "normalizers" in proc.stderr and "against" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.translation", "breakdown", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m benchmarks.translation breakdown")


def test_no_benchmark_is_run_by_its_path():
    by_path = re.compile(r"(?:python3?|\$\(PY\)) benchmarks/\w+\.py")
    runs = [
        (path.name, line)
        for path in DOCUMENTS
        if path.is_file()
        for line in path.read_text(encoding="utf-8").splitlines()
        if by_path.search(line)
    ]
    assert not runs, runs


PIPELINE = "fairseq_entmax.pipeline"


def test_no_benchmark_imports_the_examples():
    """The benchmarks stand alone: what they measure is the package, not the experiments' pipeline."""
    importing = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            importing += [
                (path.name, name) for name in names if name.startswith(("examples", "fairseq_entmax.pipeline"))
            ]
    assert not importing, importing
