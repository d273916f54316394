"""The suite's own promise: a test that needs ../shared/data or the entmax package is skipped
on a machine without them, and fails under CI (CI set), where their absence is a broken set-up
that a skip would turn green."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
NEEDS_MISSING = """
import pytest

@pytest.mark.requires(False, "the shared data is absent here")
def test_needs_missing():
    assert True

@pytest.mark.requires(True, "present")
def test_needs_present():
    assert True
"""


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_missing_requirement_skips_here_and_fails_under_ci(pytester, monkeypatch, ci):
    pytester.syspathinsert(TESTS)
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_needs=NEEDS_MISSING)
    if ci:
        monkeypatch.setenv("CI", ci)
    else:
        monkeypatch.delenv("CI", raising=False)
    result = pytester.runpytest("-rsf")
    if ci:
        # Failed in its set-up: an error, and the run's exit status is not 0.
        result.assert_outcomes(passed=1, errors=1)
        assert result.ret != 0
        result.stdout.fnmatch_lines(["*CI is set, and the shared data is absent here*"])
    else:
        result.assert_outcomes(passed=1, skipped=1)
        assert result.ret == 0
        result.stdout.fnmatch_lines(["*the shared data is absent here*"])
