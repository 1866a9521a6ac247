"""OAuth 2.1 for a remote server against a real authorization server on loopback
(tools/fixture_mcp/oauth_server.py): discovery, registration or a pre-registered client,
PKCE over the loopback redirect, refresh, a revoked grant, revocation on remove; the grant
in the 0600 secrets file and nowhere in the log."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from chalie.mcp.oauth import LoginFailed, login
from chalie.mcp.secrets import resolve
from chalie.mcp.spec import ServerSpec, SpecError, check_spec
from tools.fixture_mcp.rig import ROOT, Rig
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


class Guarded:
    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.fixture_mcp.oauth_server", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("PORT "), line
        self.base = f"http://127.0.0.1:{int(line.split()[1])}"

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def stats(self) -> dict[str, int]:
        found: dict[str, int] = httpx2.get(f"{self.base}/admin/stats").json()
        return found

    def admin(self, what: str) -> None:
        assert httpx2.post(f"{self.base}/admin/{what}").status_code == 200

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def owner_opens(url: str) -> None:
    """The owner's browser: follows the authorization server's redirect to our loopback."""
    response = httpx2.get(url, follow_redirects=True, timeout=10)
    assert response.status_code == 200, response.text


def log_in(rig: Rig, name: str) -> dict[str, Any]:
    spec = resolve(rig.admin.spec(name), rig.admin.secrets)
    shown: list[str] = []

    def show(url: str) -> None:
        shown.append(url)
        # the browser runs beside the waiting CLI
        asyncio.get_running_loop().run_in_executor(None, owner_opens, url)

    report = asyncio.run(login(spec, rig.admin.secrets, show, timeout=30))
    assert len(shown) == 1 and "code_challenge_method=S256" in shown[0]
    return report


@pytest.fixture
def guarded() -> Iterator[Guarded]:
    srv = Guarded("--ttl", "2")
    yield srv
    srv.kill()


def test_login_refresh_revoked_grant_and_revocation_on_remove(
    rig: Rig, guarded: Guarded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rig.add(ServerSpec(name="saas", transport="http", url=guarded.url, oauth=True))
    rig.start()
    # no grant yet: needing login, not offline, and calls say so
    wait_until(lambda: rig.status("saas") == "needs-login", 30, "needs login")
    row = rig.admin.store.server("saas")
    assert row is not None and "chalie mcp login saas" in row.status_reason

    report = log_in(rig, "saas")
    assert report["tools"] == 1
    assert guarded.stats()["registered"] == 1 and guarded.stats()["issued"] == 1
    secrets_file = rig.home / "mcp-secrets.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    held = json.loads(secrets_file.read_text())
    tokens = json.loads(held["saas.oauth.tokens"])
    assert tokens["access_token"] and tokens["refresh_token"]

    rig.reload()  # what chalie mcp login does to a running daemon
    rig.wait_online("saas", 30)
    rig.wait_tools("saas", 1, 30)
    rig.allow("_mcp_saas_*")
    assert "you are in" in rig.run("_mcp_saas_whoami").envelope

    # the access token lives 2 s: the heartbeat and calls go on through a refresh
    def refreshed() -> bool:
        out = rig.run("_mcp_saas_whoami")
        assert out.status == "success", out.envelope
        return guarded.stats()["refreshed"] >= 1

    wait_until(refreshed, 30, "a refresh")
    assert rig.status("saas") == "online"

    # the owner revokes the grant at the provider: mcp-auth-failed with a login hint
    guarded.admin("revoke")

    def refused() -> Any:
        out = rig.run("_mcp_saas_whoami")
        return out if out.status == "error" else None

    out = wait_until(refused, 30, "the revoked grant refused")
    assert out.code == "mcp-auth-failed" and "chalie mcp login saas" in out.envelope
    wait_until(lambda: rig.status("saas") == "needs-login", 30, "needs login again")

    # log in again, then remove: the new grant is revoked at the authorization server
    log_in(rig, "saas")
    rig.reload()
    rig.wait_online("saas", 30)
    before = guarded.stats()["revoked_by_client"]
    removed = rig.admin.remove("saas")
    assert removed["revoked_tokens"] >= 1
    assert guarded.stats()["revoked_by_client"] > before
    assert not any(k.startswith("saas.") for k in json.loads(secrets_file.read_text()))

    # no token and no refresh token ever reached the log
    text = caplog.text
    assert tokens["access_token"] not in text and tokens["refresh_token"] not in text
    assert "at-" not in text and "rt-" not in text


def test_a_pre_registered_client_needs_no_registration(rig: Rig) -> None:
    port = free_port()
    srv = Guarded("--no-dcr", "--client", f"chalie-pre:s3cret:http://127.0.0.1:{port}/callback")
    try:
        spec = ServerSpec(
            name="pre",
            transport="http",
            url=srv.url,
            oauth=True,
            oauth_client_id="chalie-pre",
            oauth_client_secret="s3cret",
            oauth_redirect_port=port,
        )
        rig.add(spec)
        stored = rig.admin.spec("pre")
        assert stored.oauth_client_secret == "${secret:pre.oauth.client_secret}"  # sealed
        assert log_in(rig, "pre")["tools"] == 1
        assert srv.stats()["registered"] == 0 and srv.stats()["issued"] == 1
        rig.start()
        rig.wait_online("pre", 30)
    finally:
        srv.kill()


def test_a_forged_callback_is_refused_and_an_abandoned_login_stores_nothing(
    rig: Rig, guarded: Guarded
) -> None:
    rig.add(ServerSpec(name="saas", transport="http", url=guarded.url, oauth=True))
    spec = resolve(rig.admin.spec("saas"), rig.admin.secrets)

    forged: list[int] = []

    def hostile(url: str) -> None:  # a forged redirect first (wrong state), then the owner
        loop = asyncio.get_running_loop()
        redirect = url.split("redirect_uri=")[1].split("&")[0]
        target = httpx2.URL(httpx2.QueryParams(f"r={redirect}")["r"])

        def forge_then_open() -> None:
            for state in ("y", ""):
                params = {"code": "x", "state": state}
                forged.append(httpx2.get(str(target.copy_merge_params(params))).status_code)
            forged.append(
                httpx2.get(str(target.copy_merge_params({"error": "access_denied"}))).status_code
            )
            owner_opens(url)

        loop.run_in_executor(None, forge_then_open)

    # Issue 30: a forged callback (any local process can send one) gets 400 and the login
    # keeps waiting; it ended the owner's login with a traceback before.
    report = asyncio.run(login(spec, rig.admin.secrets, hostile, timeout=20))
    assert forged == [400, 400, 400] and report["tools"] >= 1, (forged, report)
    rig.admin.secrets.drop_ids(["saas.oauth.tokens"])
    with pytest.raises(TimeoutError):
        asyncio.run(login(spec, rig.admin.secrets, lambda url: None, timeout=0.5))
    held = rig.admin.secrets.get("saas.oauth.tokens")
    assert held is None


@pytest.mark.parametrize(
    "fields",
    [
        {"oauth_client_id": "x"},  # oauth_* without oauth
        {"oauth": True, "oauth_client_secret": "s"},  # a secret without a client
        {"oauth": True, "oauth_client_id": "x"},  # a pre-registered client without its port
        {"oauth": True, "oauth_redirect_port": 80},
        {"oauth": True, "oauth_scope": "a\\r\\nb"},
    ],
)
def test_bad_oauth_settings_are_refused(fields: dict[str, Any]) -> None:
    fields = {
        k: v.replace("\\r\\n", "\r\n") if isinstance(v, str) else v for k, v in fields.items()
    }
    with pytest.raises(SpecError):
        check_spec(ServerSpec(name="x", transport="http", url="http://127.0.0.1:1/mcp", **fields))


def test_chalie_mcp_login_prints_the_url_and_waits(rig: Rig, guarded: Guarded) -> None:
    rig.add(ServerSpec(name="saas", transport="http", url=guarded.url, oauth=True))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from chalie_app.cli import main; sys.exit(main())",
            "--home",
            str(rig.home),
            "mcp",
            "login",
            "saas",
            "--timeout",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("http://"):
            owner_opens(line.strip())
            break
    rest = proc.stdout.read()
    proc.stdout.close()
    assert proc.wait(30) == 0, "".join(lines) + rest
    assert "saas: logged in (1 tools" in rest
    tokens = json.loads(
        json.loads((rig.home / "mcp-secrets.json").read_text())["saas.oauth.tokens"]
    )
    assert tokens["access_token"] not in "".join(lines) + rest


def test_a_401_on_a_token_believed_valid_is_refreshed_once(rig: Rig) -> None:
    srv = Guarded("--ttl", "3600")  # the access token is believed valid for an hour
    try:
        rig.add(ServerSpec(name="saas", transport="http", url=srv.url, oauth=True))
        log_in(rig, "saas")
        rig.start()
        rig.wait_online("saas", 30)
        rig.wait_tools("saas", 1, 30)
        rig.allow("_mcp_saas_*")
        assert "you are in" in rig.run("_mcp_saas_whoami").envelope
        assert srv.stats()["refreshed"] == 0
        # the provider revokes the access token alone: one refresh, and the call succeeds
        srv.admin("revoke-access")
        out = rig.run("_mcp_saas_whoami")
        assert out.status == "success" and "you are in" in out.envelope, out.envelope
        assert srv.stats()["refreshed"] == 1
        assert rig.status("saas") == "online"
        assert "you are in" in rig.run("_mcp_saas_whoami").envelope  # the new token holds
        assert srv.stats()["refreshed"] == 1
        # the refresh token revoked too: needs login, mcp-auth-failed
        srv.admin("revoke")

        def refused() -> Any:
            out = rig.run("_mcp_saas_whoami")
            return out if out.status == "error" else None

        out = wait_until(refused, 30, "the revoked grant refused")
        assert out.code == "mcp-auth-failed" and "chalie mcp login saas" in out.envelope
        wait_until(lambda: rig.status("saas") == "needs-login", 30, "needs login")
        assert srv.stats()["refreshed"] == 1  # the refused refresh is tried once, not looped
    finally:
        srv.kill()


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [("http://169.254.169.254/token", "metadata address"), ("http://10.9.8.7:80/t", "private")],
)
def test_a_token_endpoint_at_a_forbidden_address_is_never_fetched(
    rig: Rig, endpoint: str, why: str
) -> None:
    srv = Guarded("--token-endpoint", endpoint)
    try:
        rig.add(ServerSpec(name="saas", transport="http", url=srv.url, oauth=True))
        spec = resolve(rig.admin.spec("saas"), rig.admin.secrets)

        def show(url: str) -> None:
            asyncio.get_running_loop().run_in_executor(None, owner_opens, url)

        with pytest.raises(LoginFailed, match=why):
            asyncio.run(login(spec, rig.admin.secrets, show, timeout=30))
        # discovery and registration went on (the server is on loopback, so is its own
        # authorization server); the token endpoint was refused before any connection
        stats = srv.stats()
        assert stats["registered"] == 1 and stats["issued"] == 0
        assert "saas.oauth.tokens" not in json.loads((rig.home / "mcp-secrets.json").read_text())
    finally:
        srv.kill()
