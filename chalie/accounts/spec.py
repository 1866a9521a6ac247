"""One account as stored: its kind, where the server is, who logs in; never the password.

:func:`check_account` is the one validation every entry point (the CLI, the
store) goes through; it raises :class:`AccountSpecError` naming the field.
"""

from __future__ import annotations

import email.utils
import re
import urllib.parse
from typing import Final, Literal, get_args

import msgspec

Kind = Literal["caldav", "carddav", "imap", "smtp", "ics"]
KINDS: Final[tuple[str, ...]] = get_args(Kind)
# What each ability reads from: calendar reads CalDAV and ICS, writes CalDAV only.
READ_ONLY_KINDS: Final = frozenset({"ics"})
Security = Literal["tls", "starttls", "none"]
SECURITIES: Final[tuple[str, ...]] = get_args(Security)
DEFAULT_PORTS: Final[dict[tuple[str, str], int]] = {
    ("imap", "tls"): 993,
    ("imap", "starttls"): 143,
    ("imap", "none"): 143,
    ("smtp", "tls"): 465,
    ("smtp", "starttls"): 587,
    ("smtp", "none"): 25,
}
NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
HOST: Final = re.compile(r"^[A-Za-z0-9.:\[\]-]{1,253}$")
ADDRESS: Final = re.compile(r"^[^\s@<>\"',;]{1,64}@[A-Za-z0-9.-]{1,253}$")
MAX_URL: Final = 2048
MAX_USER: Final = 256


class AccountSpecError(ValueError):
    """An account that cannot be stored; the message names the field."""


class Account(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One account as stored in ``chalie.db`` (the password is in the secrets file)."""

    name: str
    kind: Kind
    url: str = ""  # caldav, carddav, ics: the http(s) URL
    host: str = ""  # imap, smtp
    port: int = 0  # imap, smtp; 0: the default for the security
    security: Security = "tls"
    username: str = ""
    address: str = ""  # imap, smtp: the user's own email address (From:)
    default: bool = False
    has_password: bool = False

    @property
    def effective_port(self) -> int:
        return self.port or DEFAULT_PORTS.get((self.kind, self.security), 0)

    @property
    def read_only(self) -> bool:
        return self.kind in READ_ONLY_KINDS

    def shown(self) -> dict[str, object]:
        """The account for display: every field but the password, which is never stored here."""
        out: dict[str, object] = {"name": self.name, "kind": self.kind, "default": self.default}
        if self.kind in ("caldav", "carddav", "ics"):
            out["url"] = _without_credentials(self.url)
        else:
            out.update(host=self.host, port=self.effective_port, security=self.security)
            if self.address:
                out["address"] = self.address
        if self.username:
            out["username"] = self.username
        out["password"] = "stored" if self.has_password else "none"
        return out


def _without_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return url


def _is_address(text: str) -> bool:
    """``alice@example.com`` or ``Alice Example <alice@example.com>``, on one line."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text) or len(text) > 320:
        return False
    _, addr = email.utils.parseaddr(text)
    return bool(ADDRESS.match(addr))


def check_account(account: Account) -> Account:
    """The account if it can be stored, else AccountSpecError naming the first bad field."""
    if not NAME.match(account.name):
        raise AccountSpecError(
            f"name {account.name!r}: use 1 to 64 lowercase letters, digits, '-' or '_'"
        )
    if account.kind in ("caldav", "carddav", "ics"):
        parts = urllib.parse.urlsplit(account.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AccountSpecError(f"{account.kind} account {account.name}: --url must be http(s)")
        if len(account.url) > MAX_URL or any(c.isspace() for c in account.url):
            raise AccountSpecError(f"{account.kind} account {account.name}: --url is malformed")
        if parts.username or parts.password:
            raise AccountSpecError(
                f"{account.kind} account {account.name}: put the user in --username and the "
                "password in the prompt, not in the URL"
            )
        if account.host or account.port or account.address:
            raise AccountSpecError(
                f"{account.kind} account {account.name}: --host, --port and --address are "
                "for imap and smtp"
            )
    else:
        if not HOST.match(account.host):
            raise AccountSpecError(f"{account.kind} account {account.name}: --host is required")
        if not 0 <= account.port <= 65535:
            raise AccountSpecError(f"{account.kind} account {account.name}: --port out of range")
        if account.url:
            raise AccountSpecError(f"{account.kind} account {account.name}: --url is for DAV/ICS")
        if account.address and not _is_address(account.address):
            raise AccountSpecError(
                f"{account.kind} account {account.name}: --address is not an email address"
            )
    if len(account.username) > MAX_USER or any(
        ord(c) < 32 or ord(c) == 127 for c in account.username
    ):
        raise AccountSpecError(f"account {account.name}: --username is malformed")
    return account
