"""``chalie accounts test NAME``: connect, log in, and say what is there; keep nothing.

A CalDAV account reports its calendars, a CardDAV account its address books,
an ICS subscription how many events it holds, IMAP its folders and the
inbox's counts, SMTP its extensions. A failure is the AccountFailure the
abilities would meet (``account-unreachable``, ``auth-failed`` ...).
"""

from __future__ import annotations

from typing import Any

from chalie.accounts.spec import Account
from chalie.personal import calendar as ical
from chalie.personal import mail
from chalie.personal.dav import Kind as DavKind
from chalie.personal.runtime import PersonalRuntime


def probe(rt: PersonalRuntime, account: Account) -> dict[str, Any]:
    creds = rt.accounts.credentials(account)
    found: dict[str, Any] = {"account": account.name, "kind": account.kind, "ok": True}
    if account.kind in ("caldav", "carddav"):
        with rt.http(creds) as http:
            kind: DavKind = "calendar" if account.kind == "caldav" else "addressbook"
            colls = rt.dav(creds, http).collections(kind)
        key = "calendars" if kind == "calendar" else "address_books"
        found[key] = [{"name": c.name, "href": c.href} for c in colls]
    elif account.kind == "ics":
        with rt.http(creds) as http:
            resp = http.request("GET", account.url, ok=(200,))
        skipped: list[dict[str, str]] = []
        parsed = ical.parse(
            resp.text, ical.Source(account.name, account.name, account.url), skipped
        )
        found["events"] = 0 if parsed is None else parsed.count
        if skipped:
            found["skipped"] = len(skipped)
    elif account.kind == "imap":
        with mail.Mailbox(creds, rt.settings.timeout, rt.settings.max_message_bytes) as box:
            found["folders"] = [f["name"] for f in box.folders()]
            found["inbox"] = box.status("INBOX")
    else:
        found.update(mail.probe_smtp(creds, rt.settings.timeout))
    return found
