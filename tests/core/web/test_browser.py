"""browser with the real Chromium (Debian's): pages, actions, the guard, the pool."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from abilities.browser import Browser
from chalie.calls import untrusted
from chalie.result import ToolResult
from chalie.web.kit import WebKit
from tests.core.web.kit import call, make_kit
from tests.core.web.site import Site
from tools.http_servers import TrickleServer
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bkit(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebKit]:
    made = make_kit(
        site,
        tmp_path_factory.mktemp("browser"),
        browser={"max_sessions": 2, "idle_close": 300, "session_idle": 300},
    )
    yield made
    made.close()


def test_a_javascript_page_is_read_typed_into_and_followed(bkit: WebKit, site: Site) -> None:
    opened = call(Browser, bkit, turn="t_js", action="open", url=site.url("/js"))
    assert opened.ok, opened.body
    assert untrusted.is_marked(opened)
    assert "The museum opens at 09:30" in opened.body  # written by the page's script
    typed = call(
        Browser, bkit, turn="t_js", action="type", selector="#q", text="ferry", submit=True
    )
    assert "You searched for ferry" in typed.body
    followed = call(Browser, bkit, turn="t_js", action="click", selector="Read the history article")
    assert followed.meta["url"] == site.url("/article")
    extracted = call(Browser, bkit, turn="t_js", action="extract")
    assert "Fort St Elmo" in extracted.body and "Section 7 of the menu" in extracted.body  # links
    scrolled = call(Browser, bkit, turn="t_js", action="scroll", amount=2)
    assert scrolled.ok


def test_a_screenshot_is_a_rich_png(bkit: WebKit, site: Site) -> None:
    call(Browser, bkit, turn="t_shot", action="open", url=site.url("/article"))
    shot = call(Browser, bkit, turn="t_shot", action="screenshot")
    assert shot.ok and shot.rich is not None
    item = shot.rich["items"][0]
    assert item["type"] == "image" and item["mime_type"] == "image/png"
    assert base64.b64decode(item["data"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert item["data"] not in shot.body  # the model gets a line, not the image


def test_every_request_of_the_page_passes_the_guard(bkit: WebKit, site: Site) -> None:
    result = call(Browser, bkit, turn="t_guard", action="open", url=site.url("/browser/private"))
    assert result.ok and "Visible text of a page" in result.body
    assert result.meta["blocked"] >= 1
    assert f"127.0.0.1:{site.other_port}" in result.body
    assert site.elsewhere_hits == []  # neither the image nor the script's fetch got there


def test_navigation_to_a_refused_address_or_through_a_redirect_fails(
    bkit: WebKit, site: Site
) -> None:
    direct = call(Browser, bkit, turn="t_nav", action="open", url="http://169.254.169.254/")
    assert direct.code == "blocked-address"
    redirected = call(Browser, bkit, turn="t_nav", action="open", url=site.url("/redirect/1"))
    assert redirected.code in ("browser-error", "blocked-address"), redirected
    assert site.elsewhere_hits == []


def test_actions_before_open_and_bad_selectors_are_errors(bkit: WebKit, site: Site) -> None:
    assert call(Browser, bkit, turn="t_none", action="extract").code == "browser-error"
    call(Browser, bkit, turn="t_sel", action="open", url=site.url("/article"))
    missing = call(Browser, bkit, turn="t_sel", action="click", selector="#does-not-exist")
    assert missing.code in ("browser-error", "tool-timeout")


def test_the_pool_is_bounded_and_closes_when_idle(site: Site, tmp_path: Path) -> None:
    kit = make_kit(
        site, tmp_path, browser={"max_sessions": 1, "idle_close": 0.5, "session_idle": 0.5}
    )
    try:
        assert not kit.browser_running  # nothing starts before the first call
        call(Browser, kit, turn="a", action="open", url=site.url("/article"))
        call(Browser, kit, turn="b", action="open", url=site.url("/article"))
        assert kit.browser.sessions() == 1  # the idle page of turn a made room
        wait_until(lambda: not kit.browser_running, 30, "the idle browser to close")
        assert kit.browser.launches == 1
        again = call(Browser, kit, turn="c", action="open", url=site.url("/js"))
        assert again.ok and kit.browser.launches == 2
    finally:
        kit.close()
    assert not kit.browser_running


def test_a_page_cannot_send_webrtc_stun_over_udp(bkit: WebKit, site: Site) -> None:
    """Issue 30: a page's RTCPeerConnection sent STUN over UDP to any address (seen on a
    loopback UDP port) despite the IP-handling flag. WebRTC is gone from the page and from
    any frame it makes; a real UDP socket hears nothing."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.setblocking(False)
        port = udp.getsockname()[1]
        opened = call(
            Browser, bkit, turn="t_rtc", action="open", url=site.url(f"/webrtc?port={port}")
        )
        assert opened.ok, opened.body
        assert "webrtc: page unavailable; frame unavailable" in opened.body, opened.body
        # What a page that started it would have sent by now (STUN goes out at once).
        again = call(Browser, bkit, turn="t_rtc", action="extract")
        assert "frame unavailable" in again.body
        try:
            heard = udp.recvfrom(2048)
        except BlockingIOError:
            heard = None
        assert heard is None, heard


def test_a_slow_page_starves_no_other_and_its_requests_end_with_its_action_or_session(
    site: Site, tmp_path: Path
) -> None:
    """Issue 30: every page's sub-requests ran on one shared executor, so one page with
    slow images (here 24, headers trickled from 6 sites) held every other page's requests,
    and they went on after the action timed out or the page closed, until the fetch
    deadline. Each page now has its own bounded executor, and its requests in flight are
    cancelled when its action times out or its session closes."""
    trickles = [TrickleServer(every=0.2) for _ in range(6)]
    allow = [f"127.0.0.1:{site.port}", *(f"127.0.0.1:{t.port}" for t in trickles)]
    kit = make_kit(
        site,
        tmp_path,
        fetch_timeout=120.0,
        allow=allow,
        browser={"max_sessions": 3, "action_timeout": 5, "idle_close": 300, "session_idle": 300},
    )
    gallery = site.url("/browser/images?each=4&ports=" + ",".join(str(t.port) for t in trickles))
    ended: dict[str, ToolResult] = {}

    def trickling() -> int:
        return sum(t.open for t in trickles)

    def open_gallery(turn: str) -> threading.Thread:
        def run() -> None:
            ended[turn] = call(Browser, kit, turn=turn, action="open", url=gallery)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    try:
        slow = open_gallery("t_slow")
        wait_until(lambda: trickling() >= 4, 30, "the gallery's images to be requested")
        began = time.monotonic()
        quick = call(Browser, kit, turn="t_quick", action="open", url=site.url("/article"))
        took = time.monotonic() - began
        assert quick.ok and "Valletta" in quick.body, (quick.code, quick.body[:200], took)
        assert took < 5, took
        slow.join(30)
        assert ended["t_slow"].code == "tool-timeout", ended["t_slow"]
        # the timed-out action's requests end now, not at the 120 s fetch deadline
        wait_until(lambda: trickling() == 0, 10, "the timed-out page's requests to end")
        # and a page closed mid-action ends its requests as it closes
        closing = open_gallery("t_close")
        wait_until(lambda: trickling() >= 4, 30, "the second gallery's images")
        kit.end_session("t_close")
        wait_until(lambda: trickling() == 0, 10, "the closed page's requests to end")
        closing.join(30)
        assert not closing.is_alive()
    finally:
        for t in trickles:
            t.close()
        kit.close()
