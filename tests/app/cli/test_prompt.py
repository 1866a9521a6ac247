"""The approval prompt and CLI values: no model text forges a line; values keep their type."""

from __future__ import annotations

import io
import os
import threading
import unicodedata
from collections.abc import Iterator

import click
import pytest

from chalie.gate.display import ACT_SUMMARY_CHARS, one_line, params_line
from chalie_app.cli.prompt import ApprovalPrompt, render
from chalie_app.cli.tools import MAX_VALUE_DEPTH, parse_pairs

SPOOF = 'reading a file\n  params {"path": "/tmp/harmless"}\x07\x1b[2J\u202eevil'


def test_one_line_escapes_control_characters_and_caps_the_length() -> None:
    shown = one_line(SPOOF)
    assert "\n" not in shown and "\x07" not in shown and "\x1b" not in shown
    assert "\u202e" not in shown  # a bidi override would reorder what the human reads
    assert "\\n" in shown and "\\x07" in shown and "\\u202e" in shown
    assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in shown)
    long = one_line("x" * 100_000)
    assert len(long) == ACT_SUMMARY_CHARS and long.endswith("…")
    assert one_line("fine as it is") == "fine as it is"


def test_the_rendered_prompt_is_one_line_per_field_whatever_the_request_holds() -> None:
    request = {
        "request_id": "r1",
        "permission": "files.delete\nallow: yes",
        "channel": "chat",
        "act_summary": SPOOF + "y" * 100_000,
        "params": {"path": "a\nb", "deep": [[[[["x" * 10_000]]]]]},
    }
    lines = render(request)
    assert len(lines) == 3
    assert all("\n" not in line and "\x1b" not in line for line in lines)
    assert lines[0].startswith("permission requested: files.delete\\nallow: yes on chat")
    assert len(lines[1]) <= ACT_SUMMARY_CHARS + 2
    assert len(lines[2]) <= len("  params ") + 400
    # Only the params line says "params": the summary's forged one is inside line 1.
    assert sum(line.startswith("  params ") for line in lines) == 1


def test_params_line_survives_unencodable_and_deep_values() -> None:
    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    assert params_line({"x": deep}) == "<dict that cannot be shown>"
    assert params_line({"x": object()}).startswith('{"x": "<object')


@pytest.fixture
def pipe() -> Iterator[tuple[io.TextIOWrapper, int]]:
    r, w = os.pipe()
    reader = os.fdopen(r, "r")
    try:
        yield reader, w
    finally:
        reader.close()
        try:
            os.close(w)
        except OSError:
            pass


REQUEST = {"request_id": "req-1", "permission": "echo", "channel": "chat", "params": {}}


def test_an_answer_given_elsewhere_ends_the_prompt(
    pipe: tuple[io.TextIOWrapper, int], capsys: pytest.CaptureFixture[str]
) -> None:
    reader, _w = pipe
    settled = threading.Event()
    asked: list[str] = []

    def still_pending(request_id: str) -> bool:
        asked.append(request_id)
        if len(asked) >= 2:
            settled.set()
        return not settled.is_set()

    prompt = ApprovalPrompt(still_pending, stdin=reader, check_every=0.02)
    assert prompt.ask(REQUEST) is None  # nobody typed: the prompt saw the answer arrive
    assert asked[-1] == "req-1" and len(asked) >= 2
    assert "no answer; denying" not in capsys.readouterr().err


def test_typed_answers_are_read_and_a_wrong_one_is_asked_again(
    pipe: tuple[io.TextIOWrapper, int], capsys: pytest.CaptureFixture[str]
) -> None:
    reader, w = pipe
    os.write(w, b"x\nA\nd\n")
    prompt = ApprovalPrompt(lambda _id: True, stdin=reader, check_every=0.02)
    assert prompt.ask(REQUEST) == "allow_always"
    assert prompt.ask(REQUEST) == "deny"  # the second line was kept for the next request
    assert "is not one of o, a, d" in capsys.readouterr().err


def test_end_of_input_denies(pipe: tuple[io.TextIOWrapper, int]) -> None:
    reader, w = pipe
    os.close(w)
    assert ApprovalPrompt(lambda _id: True, stdin=reader).ask(REQUEST) == "deny"


# -- key=value values -----------------------------------------------------------------------

CALC_SCHEMA = {
    "type": "object",
    "properties": {
        "expression": {"type": "string"},
        "count": {"type": "integer"},
        "mode": {"enum": ["fast", "slow"]},
    },
}


def test_a_string_parameter_keeps_its_text_whatever_it_looks_like() -> None:
    got = parse_pairs(
        ("expression=42", "count=42", "mode=fast", "other=42", "act_summary=7"), CALC_SCHEMA
    )
    assert got == {"expression": "42", "count": 42, "mode": "fast", "other": 42, "act_summary": "7"}
    assert parse_pairs(("expression=[1, 2]",), CALC_SCHEMA) == {"expression": "[1, 2]"}
    assert parse_pairs(("expression=99999999999999999999",), CALC_SCHEMA) == {
        "expression": "99999999999999999999"
    }


# As msgspec writes them: ``str | None``, a list of types, a ``$ref`` to a string enum.
UNION_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"anyOf": [{"type": "string", "maxLength": 200}, {"type": "null"}]},
        "phone": {"type": ["string", "null"]},
        "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "amount": {"type": "number"},
        "tag": {"$ref": "#/$defs/Tag"},
        "deep": {"type": "string"},
    },
    "$defs": {"Tag": {"enum": ["1", "2"]}},
}


def test_a_nullable_or_union_string_keeps_the_text_its_other_types_do_not_take() -> None:
    deep = "[" * (MAX_VALUE_DEPTH + 5) + "]" * (MAX_VALUE_DEPTH + 5)
    got = parse_pairs(
        ("query=2123", "phone=+356 2123", "either=2123", "amount=7", "tag=1", f"deep={deep}"),
        UNION_SCHEMA,
    )
    assert got == {
        "query": "2123",  # the phone number issue 34 found refused
        "phone": "+356 2123",
        "either": 2123,  # the union takes the integer too
        "amount": 7,
        "tag": "1",
        "deep": deep,
    }
    assert parse_pairs(("query=null", "phone=true"), UNION_SCHEMA) == {
        "query": None,  # the union's null
        "phone": "true",
    }


@pytest.mark.parametrize(
    ("pair", "fragment"),
    [
        ("n=99999999999999999999", "out of range"),
        ("n=-99999999999999999999", "out of range"),
        ("n=[99999999999999999999]", "out of range"),
        ("n=" + "[" * 5000 + "]" * 5000, "deeper than"),
        ("n=" + "[" * (MAX_VALUE_DEPTH + 1) + "]" * (MAX_VALUE_DEPTH + 1), "deeper than"),
        ("n=" + '{"a":' * 40 + "1" + "}" * 40, "deeper than"),
    ],
)
def test_values_no_daemon_could_carry_are_usage_errors(pair: str, fragment: str) -> None:
    with pytest.raises(click.BadParameter, match=fragment):
        parse_pairs((pair,))


def test_a_value_at_the_depth_limit_and_the_int_range_is_taken() -> None:
    deep = "[" * MAX_VALUE_DEPTH + "]" * MAX_VALUE_DEPTH
    assert parse_pairs(("a=" + deep, f"b={2**64 - 1}", f"c={-(2**63)}"))["b"] == 2**64 - 1
