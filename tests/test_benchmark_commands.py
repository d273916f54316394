"""The benchmarks run as modules of the benchmarks package (`python -m benchmarks.NAME`, from
the repository root): every such command in the Makefile and the Markdown names a module that
exists, and none runs a benchmark as a script by its path, which would not import the package."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "Makefile", *ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*")]


def test_every_benchmark_command_names_a_module_of_the_package():
    named = {
        (path.name, module)
        for path in DOCUMENTS
        if path.suffix in ("", ".md", ".py", ".sh")
        for module in re.findall(r"-m benchmarks\.([a-z][a-z0-9_]*)", path.read_text(encoding="utf-8"))
    }
    assert {module for _, module in named} >= {"normalizers", "compare_revisions", "gpu_check", "training"}
    missing = sorted(
        (document, module) for document, module in named if not (ROOT / "benchmarks" / f"{module}.py").exists()
    )
    assert not missing, missing


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


def test_no_benchmark_imports_the_examples():
    """The benchmarks stand alone: what they measure is the package, not the examples' pipeline."""
    importing = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            importing += [(path.name, name) for name in names if name.split(".")[0] == "examples"]
    assert not importing, importing
