"""URL-mode elicitation (2025-11-25) through the real gate: the owner is shown the link and decides;
with nobody there it is declined; Chalie never opens the link itself."""

from __future__ import annotations

import http.server
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from chalie.calls.trail import Trail
from chalie.mcp.spec import ServerSpec
from chalie.wire.events import PermissionRequest
from chalie.wire.messages import TurnContext
from chalie.wire.principals import LOCAL_OWNER
from tests.core.mcp.test_client_capabilities import with_asks
from tools.fixture_mcp.rig import ROOT, Rig
from tools.http_servers import SERVER_POLL
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def link() -> Iterator[tuple[str, list[str]]]:
    """A loopback page that counts who fetched it (nobody should)."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(SERVER_POLL,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/consent?state=abc", hits
    server.shutdown()
    server.server_close()


def turn(human: bool) -> TurnContext:
    return TurnContext(
        conversation_id="conv",
        turn_id="t1",
        channel="chat" if human else "external_agent",
        human_present=human,
        scope="unrestricted",
    )


def test_url_mode_is_shown_to_the_owner_and_never_opened(
    rig: Rig, link: tuple[str, list[str]]
) -> None:
    url, hits = link
    asks = with_asks(rig, None)
    asks._trail = rig.dispatcher  # decisions go on the trail through its one writer
    # 2025-11-25: the SDK server sends URL-mode elicitation only over a handshake session
    # (on 2026-07-28 its resolvers have no URL mode)
    rig.add(
        ServerSpec(
            name="old",
            transport="stdio",
            command=sys.executable,
            args=("-m", "tools.fixture_mcp.capable"),
            cwd=str(ROOT),
            protocol="legacy",
        )
    )
    rig.start()
    rig.wait_tools("old", 7, 40)
    rig.allow("_mcp_old_*")
    # nobody to ask: declined without a question
    out = rig.run("_mcp_old_open_link", {"url": url}, context=turn(False))
    assert "url elicitation: decline" in out.envelope, out.envelope
    seen: list[PermissionRequest] = []
    sub = rig.bus.subscribe(
        "conv", lambda e: seen.append(e) if isinstance(e, PermissionRequest) else None
    )
    for answer, action in (("allow_once", "accept"), ("deny", "decline")):
        seen.clear()
        fut = rig.call("_mcp_old_open_link", {"url": url}, context=turn(True))
        wait_until(lambda: bool(seen), 20, "the owner is shown the link")
        asked = seen[0]
        assert asked.permission == "_mcp_old.elicitation"
        assert asked.params["url"] == url and "sign in" in asked.params["message"]
        rig.policy.proxy().answer(asked.request_id, answer, LOCAL_OWNER).get(timeout=5)
        done = fut.result(30)
        assert f"url elicitation: {action}" in done.envelope, done.envelope
    sub.close()
    assert hits == []  # the owner opens it, never Chalie

    def rows() -> list[Any]:
        trail = Trail(rig.db)
        try:
            return trail.query(tool="_mcp_old.elicitation", limit=10)
        finally:
            trail.close()

    found = wait_until(lambda: len(rows()) == 2 and rows(), 10, "both decisions on the trail")
    assert sorted((r.decision, r.decided_by, r.status) for r in found) == [
        ("allow", "human", "success"),
        ("deny", "human", "error"),
    ]
    assert all(url in r.params for r in found)
