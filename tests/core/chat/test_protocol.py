"""The chat codec: a frame decodes to a message or to a structured rejection, never a crash."""

from __future__ import annotations

import json
from typing import get_args

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chalie.chat import protocol as p
from chalie.chat.session import _FRAMES
from chalie.errors import KNOWN_CODES

CODES = {p.MALFORMED, p.OVERSIZED, p.UNKNOWN_KIND, p.INVALID}


def outcome(codec: p.Codec, raw: bytes | str) -> str:
    try:
        codec.decode(raw)
    except p.FrameError as exc:
        assert exc.rejected.code in CODES
        assert "\n" not in exc.rejected.message and len(exc.rejected.message) <= 300
        return exc.rejected.code
    return "ok"


def test_every_client_frame_has_exactly_one_handler_row() -> None:
    """The session dispatches frames by one table (chalie/chat/session.py), as the
    control socket does its commands: a frame type without a row would be a fault."""
    assert set(_FRAMES) == set(get_args(p.ClientMessage))


def test_every_rejection_code_is_in_the_error_table() -> None:
    codes = {p.MALFORMED, p.OVERSIZED, p.UNKNOWN_KIND, p.INVALID, p.UNAUTHORIZED}
    codes |= {p.ORIGIN_REFUSED, p.TOO_MANY, p.TOO_MANY_OPEN, p.SLOW_CLIENT, p.UNAVAILABLE}
    assert codes <= KNOWN_CODES


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_crash_either_codec(raw: bytes) -> None:
    for fmt in ("json", "msgpack"):
        outcome(p.Codec(fmt, 1024), raw)  # type: ignore[arg-type]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([*p.KINDS, "nope", ""]),
    st.dictionaries(
        st.sampled_from(
            ["id", "text", "client_msg_id", "conversation_id", "after_seq", "answer", "x"]
        ),
        json_values,
        max_size=5,
    ),
)
def test_hostile_objects_of_every_kind_are_decoded_or_rejected(
    kind: str, fields: dict[str, object]
) -> None:
    raw = json.dumps({"type": kind, **fields})
    outcome(p.Codec("json", 1 << 20), raw)
    outcome(p.Codec("msgpack", 1 << 20), msgspec.msgpack.encode({"type": kind, **fields}))


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("[" * 100_000, p.OVERSIZED),
        ("[" * 5000 + "]" * 5000, p.MALFORMED),
        ('{"type": "send", "text": "hi", "client_msg_id": "a", "after_seq": 1}', p.INVALID),
        ('{"type": "open", "conversation_id": "c", "after_seq": 1e400}', p.INVALID),
        (
            '{"type": "open", "conversation_id": "c", "after_seq": 99999999999999999999999}',
            p.INVALID,
        ),
        ('{"type": "send", "text": "\\ud800", "client_msg_id": "a"}', p.MALFORMED),
        ('{"type": "send", "text": "hi", "client_msg_id": "a", "channel": "../etc"}', p.INVALID),
        ('{"type": "open", "conversation_id": "a/../../b"}', p.INVALID),
        ('{"type": {"nested": 1}}', p.INVALID),
        ('{"type": "' + "k" * 10_000 + '"}', p.UNKNOWN_KIND),
    ],
)
def test_edge_frames(raw: str, code: str) -> None:
    assert outcome(p.Codec("json", 64 * 1024), raw) == code


def test_an_unknown_kind_echoes_the_id_so_the_client_can_match_it() -> None:
    with pytest.raises(p.FrameError) as err:
        p.Codec("json", 1024).decode('{"type": "warp", "id": "r7"}')
    assert err.value.rejected.id == "r7" and err.value.rejected.code == p.UNKNOWN_KIND
