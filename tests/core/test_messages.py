"""Messages round-trip over msgpack, and malformed ones fail naming the field."""

from __future__ import annotations

import msgspec
import pytest

from chalie.wire import messages as m

CTX = m.TurnContext(conversation_id="c1", turn_id="t1", channel="subconscious", human_present=False)

SAMPLES: list[m.Message] = [
    CTX,
    m.ToolCall(call_id="k1", tool="clock", arguments={"zone": "UTC", "n": [1, 2]}, context=CTX),
    m.ToolOutcome(call_id="k1", tool="clock", status="error", envelope="[clock(...)]", code="x"),
    m.CancelTurn(turn_id="t1"),
    m.PermissionAnswer(request_id="r", answer="allow_always"),
    m.WorkerJob(job_id="j", ability="abilities.clock:Clock", params={"a": 1}, context=CTX),
    m.WorkerResult(job_id="j", status="success", body="b", meta={"k": 1.5}),
    m.Heartbeat(worker_id="w"),
    m.ControlRequest(command="status"),
    m.ControlReply(ok=True, data={"x": 1}),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_every_message_round_trips_over_msgpack(msg: m.Message) -> None:
    assert m.decode(m.encode(msg)) == msg


def test_a_malformed_message_names_the_field() -> None:
    raw = msgspec.msgpack.encode({"kind": "turn", "conversation_id": "c", "turn_id": 5})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.turn_id"):
        m.decode(raw)
    nested = msgspec.msgpack.encode(
        {
            "kind": "tool_call",
            "call_id": "k",
            "tool": "t",
            "context": {"kind": "turn", "conversation_id": "c", "turn_id": "t", "channel": "root"},
        }
    )
    with pytest.raises(msgspec.ValidationError, match=r"\$\.context\.channel"):
        m.decode(nested)


def test_unknown_kinds_fields_and_garbage_are_rejected() -> None:
    with pytest.raises(msgspec.ValidationError, match="kind"):
        m.decode(msgspec.msgpack.encode({"kind": "rm_rf"}))
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        m.decode(msgspec.msgpack.encode({"kind": "cancel_turn", "turn_id": "t", "extra": 1}))
    with pytest.raises(msgspec.DecodeError):
        m.decode(b"\xc1\xff\x00garbage")


def test_messages_are_frozen() -> None:
    with pytest.raises(AttributeError):
        CTX.channel = "chat"  # type: ignore[misc]
