"""The Brain backend's two shapes every route uses: an answer built from a stored row
(``view``) and an exception turned into a refusal (``refused``)."""

from __future__ import annotations

import msgspec
import pytest

from chalie.brain import api
from chalie.brain.operations import ApiProblem
from chalie.gate.policy import PolicyError, PolicyRow
from chalie.gate.tokens import TokenError
from chalie_app.brain_backend import refused, view


def test_a_view_takes_the_rows_fields_and_the_given_ones() -> None:
    row = PolicyRow(channel="chat", permission="clock", decision="internal", updated_at=5)
    assert view(api.PolicyRowView, row) == api.PolicyRowView(
        channel="chat", permission="clock", decision="internal", origin="set", updated_at=5.0
    )
    shown = view(api.PolicyRowView, row, read_only=True, origin="seen")
    assert shown.read_only is True and shown.origin == "seen" and shown.permission == "clock"


def test_a_view_refuses_a_row_that_does_not_fit() -> None:
    class Half:
        channel = "chat"

    with pytest.raises(msgspec.ValidationError, match="permission"):
        view(api.PolicyRowView, Half(), decision="allow", updated_at=1.0, origin="set")


def test_refused_maps_its_exception_and_lets_others_through() -> None:
    with pytest.raises(ApiProblem) as given:
        with refused(PolicyError, 400, "invalid-args"):
            raise PolicyError("bad permission")
    assert (given.value.status, given.value.code, given.value.message) == (
        400,
        "invalid-args",
        "bad permission",
    )
    with pytest.raises(ApiProblem) as own:
        with refused(TokenError, 409):
            raise TokenError("token-exists", "a token named x exists")
    assert (own.value.status, own.value.code) == (409, "token-exists")
    with pytest.raises(KeyError):
        with refused(PolicyError, 400, "invalid-args"):
            raise KeyError("not mine")
