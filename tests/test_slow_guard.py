"""A helper that starts a daemon fails a test that is not marked slow; a fast run does not
import a module marked slow whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slow import deselects_slow, require_slow, whole_module_slow


def test_an_unmarked_test_that_starts_a_daemon_fails_naming_the_mark() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"mark it @pytest\.mark\.slow"):
        require_slow("a daemon")


@pytest.mark.slow
def test_a_marked_test_may_start_one() -> None:
    require_slow("a daemon")


@pytest.mark.parametrize(
    ("source", "whole"),
    [
        ("import pytest\n\npytestmark = pytest.mark.slow\n\n\ndef test_a(): ...\n", True),
        (
            "pytestmark = [\n    pytest.mark.slow,\n    pytest.mark.skipif(True, reason='x'),\n]\n",
            True,
        ),
        ("import pytest\n\n\n@pytest.mark.slow\ndef test_a(): ...\n\n\ndef test_b(): ...\n", False),
        ("pytestmark = pytest.mark.skipif(True, reason='x')\n", False),
        (
            "pytestmark = [\n    pytest.mark.skipif(True, reason='x'),\n    pytest.mark.slow,\n]\n",
            False,
        ),
        (
            "pytestmark = pytest.mark.slow\npytestmark = pytest.mark.skipif(True, reason='x')\n",
            False,
        ),
        ("def helper():\n    pytestmark = pytest.mark.slow\n", False),
        ("# pytestmark = pytest.mark.slow\n", False),
    ],
    ids=[
        "alone",
        "first-of-list",
        "one-test",
        "other-mark",
        "later-in-list",
        "reassigned",
        "local",
        "comment",
    ],
)
def test_a_fast_run_skips_importing_exactly_the_modules_marked_slow_whole(
    tmp_path: Path, source: str, whole: bool
) -> None:
    module = tmp_path / "test_sample.py"
    module.write_text(source)
    assert whole_module_slow(module) is whole
    helper = tmp_path / "sample.py"  # not a test module: never skipped by this rule
    helper.write_text(source)
    assert whole_module_slow(helper) is False


class _Config:
    def __init__(self, markexpr: str) -> None:
        self.markexpr = markexpr

    def getoption(self, name: str, default: object = None) -> object:
        return self.markexpr if name == "markexpr" else default


@pytest.mark.parametrize(
    ("markexpr", "fast_only"),
    [
        ("not slow", True),
        (" not  slow ", True),
        ("", False),
        ("slow", False),
        ("not slow and x", False),
    ],
)
def test_only_a_run_of_exactly_the_fast_tests_skips_them(markexpr: str, fast_only: bool) -> None:
    assert deselects_slow(_Config(markexpr)) is fast_only  # type: ignore[arg-type]
