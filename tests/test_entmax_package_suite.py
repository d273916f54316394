"""The entmax package's own test suite, unmodified, passes against the drop-in.

The installed package (1.3) ships its tests (test_root_finding.py, test_mask.py, test_losses.py,
test_topk.py) in its folder. They run from there in a pytest subprocess in which `entmax` and its
modules are fairseq_entmax.entmax's (a plugin puts them in sys.modules before collection): every
test must pass and none be skipped.
"""

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]

# Loaded with -p before collection. It maps the package's names to the drop-in, then checks that
# every object the test modules imported is the drop-in's and that no module of the installed
# package but its tests was loaded.
PLUGIN = """
import os
import sys

import fairseq_entmax.entmax as dropin
from fairseq_entmax.entmax import activations, losses, root_finding

sys.modules["entmax"] = dropin
sys.modules["entmax.activations"] = activations
sys.modules["entmax.root_finding"] = root_finding
sys.modules["entmax.losses"] = losses


def pytest_collection_modifyitems(session, config, items):
    for module in {item.module for item in items}:
        for name, value in vars(module).items():
            origin = getattr(value, "__module__", None) or ""
            # (the test module's own functions are named after it, entmax.test_*)
            if origin != module.__name__ and (origin == "entmax" or origin.startswith("entmax.")):
                raise RuntimeError(f"{module.__name__}.{name} comes from the entmax package, not the drop-in")


def pytest_sessionfinish(session, exitstatus):
    package = os.environ["ENTMAX_PACKAGE_DIR"]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if os.path.dirname(path) == package and not os.path.basename(path).startswith("test_"):
            raise RuntimeError(f"the entmax package's {path} was imported")
"""


_SPEC = importlib.util.find_spec("entmax")
PACKAGE_DIR = None if _SPEC is None or _SPEC.origin is None else Path(_SPEC.origin).parent


@pytest.mark.slow  # the package's gradchecks: a minute
@pytest.mark.requires(PACKAGE_DIR is not None, "the entmax package (test extra, `make setup`) is not installed")
def test_the_packages_own_tests_pass_against_the_dropin(tmp_path):
    files = sorted(PACKAGE_DIR.glob("test_*.py"))
    if not files:
        pytest.skip("the installed entmax package ships no test files (test_*.py in its folder)")
    (tmp_path / "entmax_dropin_plugin.py").write_text(PLUGIN)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPOSITORY)]),
        PYTHONDONTWRITEBYTECODE="1",
        ENTMAX_PACKAGE_DIR=str(files[0].parent),
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "entmax_dropin_plugin",
        "-p",
        "no:cacheprovider",
        "-c",
        str(tmp_path / "pytest.ini"),
        "--rootdir",
        str(tmp_path),
        # The files sit in the package's folder: imported by path, not as entmax.test_*, which
        # would look for them in the drop-in.
        "--import-mode=importlib",
        "-q",
        "-rfEs",
        f"--junitxml={report}",
        *map(str, files),
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, output
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key)) for key in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] > 0 and counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, output)
