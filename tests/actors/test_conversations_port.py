"""The conversations port's adapter: what a client hears live of one conversation."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from chalie.wire.events import (
    BackgroundResult,
    PermissionRequest,
    ToolProgress,
)
from tests.conversations_double import DoublePort


def test_a_client_hears_the_recorded_request_and_result_not_their_owners_drafts() -> None:
    """The gate and the dispatcher publish a request and a result before the conversation
    records them; a client subscribed through the port hears each once, as recorded."""
    double = DoublePort()
    try:
        heard: list[Any] = []
        sub = double.port.subscribe("c1", heard.append)
        asked = PermissionRequest(
            conversation_id="c1",
            ts=time.time(),
            request_id="r1",
            tool="clock",
            permission="clock",
            expires_at=time.time() + 60,
        )
        done = BackgroundResult(
            conversation_id="c1", call_id="k1", tool="clock", status="success", envelope="e"
        )
        progress = ToolProgress(
            conversation_id="c1", turn_id="t1", call_id="k2", tool="slow", progress=0.5
        )
        for event in (asked, done, progress):
            double.bus.publish("c1", event)
        recorded = [
            msgspec.structs.replace(asked, seq=3, turn_id="t1"),
            msgspec.structs.replace(done, seq=4),
        ]
        for event in recorded:
            double.bus.publish("c1", event)
        sub.close()
        double.bus.publish("c1", recorded[0])
        assert heard == [progress, *recorded]
    finally:
        double.stop()
