"""Log hygiene for what a peer can make us log: one line a record, a bounded number."""

from __future__ import annotations

import io
import json
import logging
import sys

from chalie.mcp.session import PEER_DRIVEN_LOGGERS
from chalie.process.logs import JsonFormatter, Throttle


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def logger_with(throttle: Throttle) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger(f"test.throttle.{id(throttle)}")
    log.propagate = False
    log.handlers = [handler]
    log.addFilter(throttle)
    return log, out


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_burst_passes_the_rest_is_counted_and_said_when_the_window_turns() -> None:
    clock = Clock()
    log, out = logger_with(Throttle(burst=3, window=60.0, clock=clock))
    for i in range(1000):
        log.error("junk line %d", i)
    assert [r["msg"] for r in lines(out)] == ["junk line 0", "junk line 1", "junk line 2"]
    clock.now = 61.0
    log.error("after %s", "a minute")
    assert lines(out)[-1]["msg"] == "after a minute (997 similar records dropped)"


def test_a_traceback_becomes_one_line_naming_the_exception() -> None:
    log, out = logger_with(Throttle())
    try:
        json.loads("hello")
    except ValueError:
        log.exception("Failed to parse JSONRPC message from server")
    (record,) = lines(out)
    assert record["msg"] == "Failed to parse JSONRPC message from server (JSONDecodeError)"
    assert "Traceback" not in out.getvalue() and "exc" not in record


def test_the_sdk_loggers_a_peer_drives_are_throttled() -> None:
    for name in PEER_DRIVEN_LOGGERS:
        assert any(isinstance(f, Throttle) for f in logging.getLogger(name).filters), name
    assert "mcp.client.stdio" in PEER_DRIVEN_LOGGERS
    assert sys.modules["mcp.client.stdio"].logger.name == "mcp.client.stdio"


def test_a_record_whose_format_is_broken_never_raises_into_the_caller() -> None:
    log, out = logger_with(Throttle())
    try:
        raise OSError("pipe")
    except OSError:
        log.error("two %s %s", "args", "given one extra", "x", exc_info=True)
    (record,) = lines(out)
    assert record["msg"] == "two %s %s (OSError)"


def test_secrets_are_masked_by_their_shape_and_ordinary_words_stay() -> None:
    from chalie.gate.tokens import new_secret
    from chalie.process.logs import REDACTED, mask_text

    secret = new_secret()
    assert mask_text("no chat token existed: one was created") == (
        "no chat token existed: one was created"
    )
    assert mask_text("the token is missing; bearer certificates expire") == (
        "the token is missing; bearer certificates expire"
    )
    assert mask_text(f"leaked {secret} here") == f"leaked {REDACTED} here"
    assert mask_text(f"leaked:{secret}") == f"leaked:{REDACTED}"
    assert mask_text(f"Authorization: bearer {secret}") == f"Authorization: bearer {REDACTED}"
    assert mask_text("token=abc123 password: hunter2") == (f"token={REDACTED} password: {REDACTED}")


def test_the_mcp_sdks_session_ids_stay_out_of_the_log() -> None:
    """Issue 30 (a quirk): the MCP SDK logged every session id at info."""
    import io
    import logging

    from chalie.process import logs

    out = io.StringIO()
    root = logging.getLogger()
    sdk = logging.getLogger("mcp.server.streamable_http_manager")
    before = list(root.handlers), root.level, sdk.level
    try:
        logs.configure(logging.INFO, out)
        sdk.info("Created new transport with session ID: 0123456789abcdef")
        sdk.warning("a warning still shows")
        logging.getLogger("chalie.test").info("ours still shows")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in before[0]:
            root.addHandler(h)
        root.setLevel(before[1])
        sdk.setLevel(before[2])
    text = out.getvalue()
    assert "0123456789abcdef" not in text
    assert "a warning still shows" in text and "ours still shows" in text
