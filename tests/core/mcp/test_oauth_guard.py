"""The SSRF guard on a remote server's authorization-server URLs (chalie.mcp.oauth.AuthGuard):
public addresses only, loopback only where the configured server itself is on loopback, and
each request pinned to the address that was checked."""

from __future__ import annotations

import httpx2
import pytest

from chalie.mcp.oauth import AuthGuard
from chalie.net.ssrf import Blocked

PUBLIC = "93.184.216.34"
NAMES = {
    "mcp.example.com": [PUBLIC],
    "auth.example.com": ["93.184.216.35"],
    "lan.example": ["10.0.0.2"],
    "rebind.example": [PUBLIC, "127.0.0.1"],
    "localhost": ["127.0.0.1", "::1"],
}


def resolver(host: str, _port: int) -> list[str]:
    return NAMES.get(host, [])


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/token",
        "http://localhost/token",
        "http://[::1]/token",
        "http://10.0.0.1/register",
        "http://lan.example/token",
        "http://169.254.169.254/latest",
        "http://rebind.example/token",
        "http://2130706433/token",
        "file:///etc/passwd",
        "http://user:pw@auth.example.com/token",
    ],
)
def test_a_public_server_s_authorization_urls_must_be_public(url: str) -> None:
    guard = AuthGuard("https://mcp.example.com/mcp", resolver)
    with pytest.raises(Blocked):
        guard.check(url)


@pytest.mark.parametrize("server", ["http://127.0.0.1:9000/mcp", "http://localhost:9000/mcp"])
def test_a_loopback_server_may_use_loopback_and_nothing_else_private(server: str) -> None:
    guard = AuthGuard(server, resolver)
    assert guard.check("http://127.0.0.1:9001/token").address == "127.0.0.1"
    assert guard.check("https://auth.example.com/token").address == "93.184.216.35"
    for refused in ("http://10.0.0.1/token", "http://169.254.169.254/", "http://lan.example/"):
        with pytest.raises(Blocked):
            guard.check(refused)


def test_a_private_server_gets_no_loopback_allowance() -> None:
    guard = AuthGuard("http://lan.example/mcp", resolver)
    with pytest.raises(Blocked):
        guard.check("http://127.0.0.1/token")


def test_a_request_is_pinned_to_the_checked_address() -> None:
    guard = AuthGuard("https://mcp.example.com/mcp", resolver)
    request = httpx2.Request("POST", "https://auth.example.com/token", data={"a": "b"})
    guard.pin(request, guard.check(str(request.url)))
    assert request.url.host == "93.184.216.35" and request.url.path == "/token"
    assert request.headers["host"] == "auth.example.com"
    assert request.extensions["sni_hostname"] == "auth.example.com"
