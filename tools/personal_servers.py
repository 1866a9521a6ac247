"""Real servers on loopback for the personal abilities' tests and benches.

Radicale (CalDAV/CardDAV, from PyPI), a throw-away Dovecot IMAP instance
(Debian's dovecot-imapd, its own config, mail folder and port), aiosmtpd
delivering into that Dovecot with dovecot-lda, and a small HTTP server that
answers with Open-Meteo's documented JSON. Each starts on a free port, is
ready when it answers, and is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tools.http_servers import SERVER_POLL

MAIL_USER = "imaptest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[Any] | None = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before port {port} opened")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"port {port} not up within {timeout} s")


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# -- Radicale -----------------------------------------------------------------------------


@dataclass
class Radicale:
    url: str
    users: dict[str, str]
    folder: Path


@contextmanager
def radicale(users: dict[str, str] | None = None) -> Iterator[Radicale]:
    users = users or {"alice": "secret", "bob": "hunter2"}
    root = Path(tempfile.mkdtemp(prefix="radicale-"))
    (root / "users").write_text("".join(f"{u}:{p}\n" for u, p in users.items()))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "radicale",
        "--config",
        "",
        "--server-hosts",
        f"127.0.0.1:{port}",
        "--auth-type",
        "htpasswd",
        "--auth-htpasswd-filename",
        str(root / "users"),
        "--auth-htpasswd-encryption",
        "plain",
        "--auth-delay",
        "0",
        "--rights-type",
        "owner_only",
        "--storage-filesystem-folder",
        str(root / "collections"),
        "--logging-level",
        "error",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield Radicale(f"http://127.0.0.1:{port}", users, root)
    finally:
        stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def dav_request(
    base: str, user: str, password: str, method: str, path: str, body: str = "", **headers: str
) -> int:
    """One raw request against Radicale (to seed collections); returns the status."""
    import httpx2

    with httpx2.Client(auth=(user, password), timeout=30) as c:
        r = c.request(method, base + path, content=body.encode(), headers=headers)
        return r.status_code


def make_calendar(server: Radicale, user: str, slug: str, name: str) -> str:
    body = (
        '<?xml version="1.0" encoding="utf-8"?><C:mkcalendar xmlns:D="DAV:" '
        'xmlns:C="urn:ietf:params:xml:ns:caldav"><D:set><D:prop>'
        f"<D:displayname>{name}</D:displayname></D:prop></D:set></C:mkcalendar>"
    )
    path = f"/{user}/{slug}/"
    status = dav_request(server.url, user, server.users[user], "MKCALENDAR", path, body)
    assert status == 201, status
    return path


def make_addressbook(server: Radicale, user: str, slug: str, name: str) -> str:
    body = (
        '<?xml version="1.0" encoding="utf-8"?><D:mkcol xmlns:D="DAV:" '
        'xmlns:C="urn:ietf:params:xml:ns:carddav"><D:set><D:prop><D:resourcetype>'
        "<D:collection/><C:addressbook/></D:resourcetype>"
        f"<D:displayname>{name}</D:displayname></D:prop></D:set></D:mkcol>"
    )
    path = f"/{user}/{slug}/"
    status = dav_request(
        server.url,
        user,
        server.users[user],
        "MKCOL",
        path,
        body,
        **{"Content-Type": "application/xml"},
    )
    assert status == 201, status
    return path


def put_object(server: Radicale, user: str, path: str, text: str, content_type: str) -> None:
    status = dav_request(
        server.url, user, server.users[user], "PUT", path, text, **{"Content-Type": content_type}
    )
    assert status in (201, 204), status


# -- a static HTTP server (ICS feeds, Open-Meteo) ------------------------------------------


@dataclass
class Http:
    url: str
    hits: list[str]


@contextmanager
def http_server(
    route: Callable[[str, dict[str, list[str]], dict[str, str]], tuple[int, dict[str, str], bytes]],
) -> Iterator[Http]:
    """A loopback HTTP server whose answers come from ``route(path, query, headers)``.

    GET, and WebDAV's PROPFIND and REPORT (the method in ``headers["X-Method"]``) for a
    hand-written, hostile DAV server.
    """
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PROPFIND(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.headers["X-Method"] = self.command
            self.do_GET()

        do_REPORT = do_PROPFIND

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            hits.append(self.path)
            status, headers, body = route(
                parts.path, urllib.parse.parse_qs(parts.query), dict(self.headers)
            )
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, args=(SERVER_POLL,), daemon=True)
    thread.start()
    try:
        yield Http(f"http://127.0.0.1:{srv.server_address[1]}", hits)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def json_answer(data: Any, status: int = 200) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


# -- Dovecot + aiosmtpd --------------------------------------------------------------------


def mail_user() -> tuple[int, int]:
    """The unprivileged mail user Dovecot needs (uid 0 is refused); created when missing."""
    try:
        pw = pwd.getpwnam(MAIL_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", MAIL_USER],
            check=True,
        )
        pw = pwd.getpwnam(MAIL_USER)
    return pw.pw_uid, pw.pw_gid


def have_dovecot() -> bool:
    return shutil.which("dovecot") is not None and os.path.exists("/usr/lib/dovecot/dovecot-lda")


@dataclass
class Dovecot:
    port: int
    users: dict[str, str]
    root: Path
    config: Path

    def maildir(self, user: str) -> Path:
        return self.root / "mail" / user / "Maildir"

    def deliver(self, user: str, raw: bytes, sender: str = "sender@example.com") -> None:
        r = subprocess.run(
            ["/usr/lib/dovecot/dovecot-lda", "-c", str(self.config), "-d", user, "-f", sender],
            input=raw,
            capture_output=True,
        )
        if r.returncode != 0:
            raise RuntimeError(f"dovecot-lda failed: {r.stderr.decode()[-300:]}")


@contextmanager
def dovecot(users: dict[str, str] | None = None) -> Iterator[Dovecot]:
    users = users or {"alice": "secret", "bob": "hunter2"}
    uid, gid = mail_user()
    root = Path(tempfile.mkdtemp(prefix="dovecot-"))
    os.chmod(root, 0o755)
    (root / "passwd").write_text("".join(f"{u}:{{PLAIN}}{p}\n" for u, p in users.items()))
    (root / "mail").mkdir()
    os.chown(root / "mail", uid, gid)
    port = free_port()
    conf = root / "dovecot.conf"
    conf.write_text(f"""
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
mail_location = maildir:~/Maildir
namespace inbox {{
  inbox = yes
  mailbox Drafts {{
    special_use = \\Drafts
    auto = subscribe
  }}
  mailbox Sent {{
    special_use = \\Sent
    auto = subscribe
  }}
  mailbox Archive {{
    special_use = \\Archive
    auto = subscribe
  }}
}}
passdb {{
  driver = passwd-file
  args = {root}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={root}/mail/%u
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
""")
    proc = subprocess.Popen(
        ["dovecot", "-c", str(conf), "-F"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port, proc)
        yield Dovecot(port, users, root, conf)
    finally:
        stop(proc)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Smtp:
    port: int
    received: list[tuple[str, list[str], bytes]]


@contextmanager
def smtp(store: Dovecot | None = None, users: dict[str, str] | None = None) -> Iterator[Smtp]:
    """aiosmtpd with AUTH PLAIN/LOGIN over plain text on loopback; delivers to ``store``."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword

    users = users if users is not None else {"alice": "secret"}
    received: list[tuple[str, list[str], bytes]] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            received.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
            if store is not None:
                for rcpt in envelope.rcpt_tos:
                    local = rcpt.split("@")[0]
                    if local in store.users:
                        store.deliver(local, envelope.content, envelope.mail_from)
            return "250 OK"

    def authenticator(
        server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        if isinstance(auth_data, LoginPassword):
            user, pw = auth_data.login.decode(), auth_data.password.decode()
            if users.get(user) == pw:
                return AuthResult(success=True)
        return AuthResult(success=False, handled=False)

    port = free_port()
    ctl = Controller(
        Handler(),
        hostname="127.0.0.1",
        port=port,
        authenticator=authenticator,
        auth_require_tls=False,
        auth_required=False,  # AUTH is offered and checked; required-without-TLS only warns
        data_size_limit=64 * 1024 * 1024,
    )
    ctl.start()
    try:
        yield Smtp(port, received)
    finally:
        ctl.stop()
