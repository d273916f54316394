"""The torch-only tests (the normalizers, their modules, the entmax drop-in, the Hugging Face
integration, the analysis metrics) pass where fairseq cannot be imported, as on a machine with torch alone: only the
fairseq tests request the plugin (conftest's `fairseq_plugin`)."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

# It runs the fast tier of the files that call each package's code (RUN) once more, and
# collects the others (their modules imported), in subprocesses: about half a minute.
pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent

# The test files that import neither fairseq nor the fairseq layer of fairseq_entmax: those that
# go through each torch-only package's functions (the attention, the drop-in, the Hugging Face
# integration, the normalizer modules and API, the analysis metrics), run ...
RUN = [
    "test_analysis_metrics.py",
    "test_attention.py",
    "test_entmax_dropin.py",
    "test_huggingface_finetuning.py",
    "test_huggingface_sparsify.py",
    "test_normalizer_modules.py",
    "test_normalizers_api.py",
]
# ... and those that check the numerics of the same functions, collected.
COLLECTED = [
    "test_entmax_package_suite.py",
    "test_huggingface_attention.py",
    "test_normalizers_compile.py",
    "test_normalizers_cuda.py",
    "test_normalizers_entmax_package.py",
    "test_normalizers_gradcheck.py",
    "test_normalizers_properties.py",
    "test_normalizers_sync_free.py",
]

# Imported by every Python started with the folder on PYTHONPATH (the tests' own subprocesses
# too): a finder ahead of the others finds fairseq nowhere, so `import fairseq` raises
# ModuleNotFoundError as where it is not installed, and nothing of it enters sys.modules.
WITHOUT_FAIRSEQ = """
import sys


class WithoutFairseq:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in ("fairseq", "fairseq_cli"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, WithoutFairseq)
"""


@pytest.fixture
def without_fairseq(tmp_path):
    """The environment of a Python that cannot import fairseq (through a sitecustomize)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WITHOUT_FAIRSEQ, encoding="utf-8")
    return {**os.environ, "PYTHONPATH": str(site)}


def test_fairseq_cannot_be_imported_in_that_environment(without_fairseq):
    proc = subprocess.run(
        [sys.executable, "-c", "import fairseq"], env=without_fairseq, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'fairseq'" in proc.stderr


def _pytest(arguments, without_fairseq):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"] + arguments,
        cwd=TESTS.parent,
        env=without_fairseq,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_the_torch_only_tests_pass_without_fairseq(without_fairseq, tmp_path):
    """Every listed file is collected (its module imported) and the fast tier of RUN passes:
    the slow tier, compilation and fresh processes, would double their cost in the suite."""
    junit = tmp_path / "torch-only.xml"
    proc = _pytest(["-m", "not slow", "--junitxml", str(junit)] + [str(TESTS / name) for name in RUN], without_fairseq)
    # 0: every file collected and every selected test passed (a collection error gives 2).
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
    assert int(suite.get("tests")) > int(suite.get("skipped")) + 100, "tests ran, not only skips"
    collected = _pytest(["--collect-only"] + [str(TESTS / name) for name in COLLECTED], without_fairseq)
    assert collected.returncode == 0, collected.stdout[-5000:] + collected.stderr[-2000:]
    for name in COLLECTED:
        assert f"{name}::" in collected.stdout or f"<Module {name}>" in collected.stdout, name
