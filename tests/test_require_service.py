"""testkit.require_service and the `service` mark: a missing service fails the test under CI=true and
skips it elsewhere; a test that skips for want of a GPU (not a service) still skips under CI."""
from __future__ import annotations

from pathlib import Path

import pytest
from testkit import require_service, services_required

pytest_plugins = ("pytester",)
TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_under_ci_a_missing_service_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert services_required()
    with pytest.raises(pytest.fail.Exception, match="Thing is required under CI=true .*: not installed here"):
        require_service("Thing", "not installed here")


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_outside_ci_a_missing_service_skips(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not services_required()
    with pytest.raises(pytest.skip.Exception, match="needs Thing: not installed here"):
        require_service("Thing", "not installed here")


def _run_marked_tests(pytester: pytest.Pytester) -> pytest.RunResult:
    """A throwaway test tree with this suite's conftest.py and testkit.py: one test whose service is
    absent, one whose service is present, one that needs a GPU (a plain skipif, as the CUDA tests use)."""
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(testkit=(TESTS / "testkit.py").read_text())
    pytester.makepyfile(test_marked="""
        import pytest
        from testkit import needs_service

        @needs_service("Thing", False, "not installed here")
        def test_needs_absent_thing():
            pass

        @needs_service("Other", True, "unused")
        def test_needs_present_other():
            pass

        @pytest.mark.skipif(True, reason="needs a CUDA GPU")
        def test_needs_gpu():
            pass
    """)
    # no:phoenix as in pyproject's addopts, which this throwaway tree does not read: Phoenix's client registers
    # a pytest plugin that imports its server, ~15 s of CPU in each run here.
    return pytester.runpytest_subprocess("-rA", "-p", "no:cacheprovider", "-p", "no:phoenix")


def test_the_mark_fails_under_ci_and_gpu_tests_still_skip(pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = _run_marked_tests(pytester)
    result.assert_outcomes(passed=1, skipped=1, errors=1)
    result.stdout.fnmatch_lines(["*SKIPPED*needs a CUDA GPU*",
                                 "ERROR*test_needs_absent_thing*Thing is required under CI=true*not installed here*"])


def test_the_mark_skips_outside_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = _run_marked_tests(pytester)
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*needs Thing: not installed here*"])
