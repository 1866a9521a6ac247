"""A helper that starts a daemon fails a test that is not marked slow."""

from __future__ import annotations

import pytest

from tests.slow import require_slow


def test_an_unmarked_test_that_starts_a_daemon_fails_naming_the_mark() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"mark it @pytest\.mark\.slow"):
        require_slow("a daemon")


@pytest.mark.slow
def test_a_marked_test_may_start_one() -> None:
    require_slow("a daemon")
