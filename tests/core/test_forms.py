"""Forms a person fills (chalie.gate.forms) and the decision an answer to one makes
(chalie.gate.policy.answer_decision): the answer fits the schema or is refused, nothing but a
form takes content, and a credential field is named as one."""

from __future__ import annotations

from typing import Any

import pytest

from chalie.gate.forms import BadAnswer, check_answer, fields, secret_fields
from chalie.gate.policy import PolicyError, answer_decision

FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name"],
}


def test_an_answer_that_fits_the_form_is_kept_as_given() -> None:
    assert check_answer(FORM, {"name": "Ann", "age": 41}) == {"name": "Ann", "age": 41}
    assert check_answer(FORM, {"name": "Ann", "tags": ["a", "b"]})["tags"] == ["a", "b"]


@pytest.mark.parametrize(
    "content",
    [
        None,
        "Ann",
        ["Ann"],
        {},  # name is required
        {"name": "A" * 41},
        {"name": "Ann", "age": -1},
        {"name": "Ann", "age": "old"},
        {"name": {"nested": {"deeper": 1}}},
        {"name": "Ann", "tags": [1, 2]},
        {f"f{i}": "x" for i in range(33)},
    ],
)
def test_an_answer_that_does_not_fit_is_refused(content: Any) -> None:
    with pytest.raises(BadAnswer):
        check_answer(FORM, content)


def test_a_form_that_is_not_a_schema_is_refused_not_raised() -> None:
    with pytest.raises(BadAnswer, match="not a valid schema"):
        check_answer({"type": "no-such-type"}, {"a": 1})


def test_credential_fields_are_named_and_fields_shown() -> None:
    form = {
        "properties": {
            "user": {"type": "string"},
            "Password": {"type": "string"},
            "api_key": {"type": "string"},
            "word": {"type": "string", "format": "password"},
        }
    }
    assert secret_fields(form) == ["Password", "api_key", "word"]
    assert secret_fields({"properties": "junk"}) == [] and fields({}) == {}
    assert set(fields(FORM)) == {"name", "age", "tags"}


def test_the_decision_an_answer_makes() -> None:
    perm = "_mcp_cap.elicitation"
    accepted = answer_decision("allow_once", perm, FORM, {"name": "Ann"})
    assert accepted.allowed and accepted.content == {"name": "Ann"}
    again = answer_decision("allow_always", perm, FORM, {"name": "Bo"})
    assert again.allowed and again.content == {"name": "Bo"}
    declined = answer_decision("deny", perm, FORM, None)
    assert not declined.allowed and declined.content is None
    assert answer_decision("deny", perm, FORM, {"name": "x"}).content is None  # ignored
    with pytest.raises(PolicyError, match="form"):
        answer_decision("allow_once", perm, FORM, None)  # a form needs its fields
    with pytest.raises(PolicyError, match="fit the form"):
        answer_decision("allow_once", perm, FORM, {"name": 3})
    with pytest.raises(PolicyError, match="only a request with a form"):
        answer_decision("allow_once", "web_fetch", None, {"name": "Ann"})
    plain = answer_decision("allow_once", "web_fetch")
    assert plain.allowed and plain.content is None
    with pytest.raises(PolicyError):
        answer_decision("maybe", perm, FORM, {"name": "Ann"})
