"""Safe decoding of socket frames (depth limit) and the rate-limited drop log."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import msgspec
import pytest

from chalie.process import control
from chalie.wire.frames import (
    MAX_DEPTH,
    DropLog,
    SafeDecoder,
    TooDeep,
    check_depth,
    check_sendable,
    decode_message,
)
from chalie.wire.messages import ControlRequest, Heartbeat, WorkerJob, encode

DEEP = 200_000


def nested(depth: int, kind: str = "array") -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "array" else {"k": value}
    return value


def raw_nest(depth: int, header: bytes) -> bytes:
    """A msgpack frame of ``depth`` one-element containers, built without recursion."""
    return header * depth + b"\xc0"


@pytest.mark.parametrize("kind", ["array", "map"])
def test_nesting_up_to_the_limit_decodes_and_one_more_level_is_refused(kind: str) -> None:
    check_depth(msgspec.msgpack.encode(nested(MAX_DEPTH, kind)))
    with pytest.raises(TooDeep):
        check_depth(msgspec.msgpack.encode(nested(MAX_DEPTH + 1, kind)))


@pytest.mark.parametrize(
    "header",
    [
        b"\x91",  # fixarray
        b"\x81\xa1k",  # fixmap with a str key
        b"\xdc\x00\x01",  # array16
        b"\xdd\x00\x00\x00\x01",  # array32
        b"\xde\x00\x01\xa1k",  # map16
        b"\xdf\x00\x00\x00\x01\xa1k",  # map32
    ],
)
def test_a_frame_nested_200000_deep_is_a_decode_error_not_a_recursion_error(
    header: bytes,
) -> None:
    frame = raw_nest(DEEP, header)
    began = time.perf_counter()
    with pytest.raises(msgspec.DecodeError, match="deeper than 64"):
        decode_message(frame)
    assert time.perf_counter() - began < 1.0  # stops at the limit, not at the end


def test_deep_nesting_inside_a_valid_envelope_is_refused() -> None:
    # A WorkerJob whose params hold the deep value: the envelope itself is valid.
    head = encode(WorkerJob(job_id="j", ability="m:C", params={"x": None}))
    frame = head.replace(b"\xa1x\xc0", b"\xa1x" + raw_nest(DEEP, b"\x91"))
    assert len(frame) > DEEP
    with pytest.raises(TooDeep):
        decode_message(frame)


def test_strings_full_of_container_bytes_are_skipped_not_counted() -> None:
    # Non-ASCII text is full of bytes that look like fixarray/fixmap headers.
    text = "é" * 10_000 + "\x9f\x80" * 5000
    frame = encode(Heartbeat(worker_id=text))
    assert isinstance(decode_message(frame), Heartbeat)
    blob = msgspec.msgpack.encode([b"\x91" * 70_000, "\x91" * 300])
    check_depth(blob)


def test_random_and_truncated_frames_only_ever_raise_decode_errors() -> None:
    rng = random.Random(8)
    good = encode(WorkerJob(job_id="j", ability="m:C", params={"a": [1, {"b": "c"}]}))
    frames = [rng.randbytes(rng.randint(0, 300)) for _ in range(20_000)]
    frames += [good[:n] for n in range(len(good))]
    frames += [b"\xdd\xff\xff\xff\xff" * 100, b"\xc1" * 100, b"\xdb\xff\xff\xff\xff"]
    for frame in frames:
        try:
            decode_message(frame)
        except msgspec.DecodeError:
            pass


def test_a_typed_decoder_keeps_its_type_and_its_limit() -> None:
    decoder = SafeDecoder[ControlRequest](ControlRequest, max_depth=3)
    ok = msgspec.msgpack.encode({"kind": "control_request", "command": "x", "args": {"a": 1}})
    assert decoder.decode(ok) == ControlRequest(command="x", args={"a": 1})
    deep = msgspec.msgpack.encode({"kind": "control_request", "command": "x", "args": {"a": [[1]]}})
    with pytest.raises(TooDeep):
        decoder.decode(deep)
    with pytest.raises(msgspec.ValidationError):
        decoder.decode(msgspec.msgpack.encode({"kind": "heartbeat"}))


def test_check_sendable_names_a_frame_the_receiver_would_refuse() -> None:
    assert check_sendable(msgspec.msgpack.encode(nested(10))) is None
    assert "deeper than" in str(check_sendable(msgspec.msgpack.encode(nested(MAX_DEPTH + 1))))


def test_control_requests_nested_too_deep_get_a_malformed_reply() -> None:
    frame = control.encode_request(
        "tools.call", {"tool": "echo", "arguments": {"v": nested(MAX_DEPTH)}}
    )
    commands = {"tools.call": control.ToolsCallArgs}
    parsed = control.parse_request(frame, commands)
    assert isinstance(parsed, control.ControlReply)
    assert parsed.error == control.MALFORMED
    assert "deeper than" in parsed.data["message"]
    shallow = control.encode_request("tools.call", {"tool": "echo", "arguments": {"v": [[1]]}})
    assert parsed != control.parse_request(shallow, commands)
    assert not isinstance(control.parse_request(shallow, commands), control.ControlReply)


def test_the_drop_log_logs_a_burst_then_one_summary_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    drops = DropLog(
        logging.getLogger("chalie.test.wire"),
        "test socket",
        burst=3,
        interval=5.0,
        clock=lambda: now[0],
    )
    caplog.set_level(logging.WARNING, logger="chalie.test.wire")
    for _ in range(10_000):
        drops.drop(b"flooder", "garbage")
    assert drops.total == 10_000
    assert len(caplog.records) == 3  # the burst; the rest waits for the interval
    now[0] = 6.0
    drops.drop(b"flooder", "garbage")
    assert len(caplog.records) == 4
    assert "9998 more frames" in caplog.records[-1].getMessage()
    for _ in range(1000):
        drops.drop(b"flooder", "garbage")
    assert len(caplog.records) == 4
