"""Running an ability: non-ToolResult returns and exceptions become error results."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from chalie.ability import Ability
from chalie.calls.envelope import render
from chalie.calls.invoke import invoke
from chalie.result import ToolResult

EX = tuple(f"phrase {i}" for i in range(6))


class ReturnsString(Ability):
    name = "returns_string"
    summary = "Returns a raw string."
    tooltip = "bad"
    examples = EX

    def run(self, params: Any) -> Any:
        return "just a string"


class Raises(Ability):
    name = "raises"
    summary = "Raises."
    tooltip = "bad"
    examples = EX

    def run(self, params: Any) -> ToolResult:
        raise RuntimeError("secret-token-123 leaked in a message")


def test_a_non_toolresult_becomes_non_canonical_result() -> None:
    r = invoke(ReturnsString(), {})
    assert (r.status, r.code) == ("error", "non-canonical-result")
    assert "str" in r.body


def test_an_exception_becomes_an_error_envelope_with_the_traceback_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="chalie.calls.invoke"):
        r = invoke(Raises(), {})
    assert (r.status, r.code) == ("error", "unhandled-exception")
    text = render("raises", r)
    assert "secret-token-123" not in text and "Traceback" not in text
    assert "RuntimeError" in text
    assert any(rec.exc_info for rec in caplog.records)
