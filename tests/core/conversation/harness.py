"""The conversation harness (``tools/conversation_harness.py``) for the tests: a test that
starts one must carry the slow mark."""

from __future__ import annotations

from typing import Any

from tests.slow import require_slow
from tools import conversation_harness
from tools.conversation_harness import FORMATS, assert_valid_history, base_url, config_toml

__all__ = ["FORMATS", "Harness", "assert_valid_history", "base_url", "config_toml"]


class Harness(conversation_harness.Harness):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        require_slow("a daemon and a scripted model")
        super().__init__(*args, **kwargs)
