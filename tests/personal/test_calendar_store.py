"""The calendar cache file: a restarted runtime revalidates by CTag, syncs by token (Radicale)."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from abilities.calendar import Calendar, CalendarParams
from chalie.accounts.spec import Account
from chalie.accounts.store import AccountStore, Credentials
from chalie.personal.calstore import CalendarStore
from chalie.personal.http import HttpClient, Response
from chalie.personal.runtime import PersonalRuntime, PersonalSettings
from chalie.process.home import personal_cache_file
from chalie.services import Services
from chalie_app.cli import cli
from tools.personal_servers import (
    Radicale,
    dav_request,
    http_server,
    make_calendar,
    put_object,
    radicale,
)

pytestmark = pytest.mark.slow


def vevent(uid: str, day: int, title: str) -> str:
    return (
        "BEGIN:VCALENDAR\nVERSION:2.0\nPRODID:t\nBEGIN:VEVENT\n"
        f"UID:{uid}\nDTSTAMP:20250101T000000Z\nDTSTART:202503{day:02d}T100000Z\n"
        f"DTEND:202503{day:02d}T110000Z\nSUMMARY:{title}\nEND:VEVENT\nEND:VCALENDAR\n"
    )


@pytest.fixture
def server() -> Iterator[Radicale]:
    with radicale() as srv:
        make_calendar(srv, "alice", "work", "Work")
        for i in range(1, 6):
            put_object(
                srv, "alice", f"/alice/work/e{i}.ics", vevent(f"e{i}", i, f"E{i}"), "text/calendar"
            )
        yield srv


class Counted(PersonalRuntime):
    """A runtime that notes every request its HTTP clients send (method, path)."""

    sent: list[tuple[str, str]]

    def http(self, creds: Credentials) -> HttpClient:
        client = super().http(creds)
        plain = client.request

        def request(method: str, url: str, **kw: Any) -> Response:
            self.sent.append((method, url.split("//", 1)[-1].split("/", 1)[-1]))
            return plain(method, url, **kw)

        client.request = request  # type: ignore[method-assign]
        return client


def runtime(book: AccountStore, home: Path) -> Counted:
    rt = Counted(book, PersonalSettings(), store=CalendarStore(personal_cache_file(home)))
    rt.sent = []
    return rt


def titles(rt: PersonalRuntime) -> list[str]:
    got = Calendar(None, Services(personal=rt)).run(
        CalendarParams(start="2025-03-01", end="2025-03-31")
    )
    assert got.ok, got.body
    return [e["title"] for e in json.loads(got.body.split("\n", 1)[1])["events"]]


def test_a_restarted_runtime_answers_from_the_cache_file_after_one_propfind(
    book: AccountStore, home: Path, server: Radicale
) -> None:
    book.add(Account(name="work", kind="caldav", url=server.url + "/", username="alice"), "secret")
    first = runtime(book, home)
    assert titles(first) == ["E1", "E2", "E3", "E4", "E5"]
    # never seen: discovery, the collections, one sync-collection REPORT with every object
    assert [m for m, _ in first.sent].count("REPORT") == 1
    assert os.stat(personal_cache_file(home)).st_mode & 0o777 == 0o600
    first.store.close()  # type: ignore[union-attr]

    again = runtime(book, home)  # a new daemon: nothing in memory
    assert titles(again) == ["E1", "E2", "E3", "E4", "E5"]
    assert again.sent == [("PROPFIND", "alice/")]  # the collections and their CTags; nothing else

    put_object(server, "alice", "/alice/work/e2.ics", vevent("e2", 2, "E2 moved"), "text/calendar")
    dav_request(server.url, "alice", "secret", "DELETE", "/alice/work/e4.ics", "")
    again.sent.clear()
    assert titles(again) == ["E1", "E2 moved", "E3", "E5"]
    assert [m for m, _ in again.sent] == ["PROPFIND", "REPORT"]  # the token's changes only
    again.store.close()  # type: ignore[union-attr]

    third = runtime(book, home)
    assert titles(third) == ["E1", "E2 moved", "E3", "E5"]
    assert [m for m, _ in third.sent] == ["PROPFIND"]
    third.store.close()  # type: ignore[union-attr]

    # removing the account drops what was synced from it
    out = CliRunner().invoke(cli, ["--home", str(home), "accounts", "remove", "work"])
    assert out.exit_code == 0, out.output
    with sqlite3.connect(personal_cache_file(home)) as db:
        for table in ("cal_objects", "cal_collections", "listings"):
            assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_an_expired_token_and_an_account_pointed_elsewhere_start_over(
    book: AccountStore, home: Path, server: Radicale
) -> None:
    book.add(Account(name="work", kind="caldav", url=server.url + "/", username="alice"), "secret")
    rt = runtime(book, home)
    assert len(titles(rt)) == 5
    rt.store.close()  # type: ignore[union-attr]
    path = personal_cache_file(home)
    with sqlite3.connect(path) as db:  # the server forgot the token; the CTag moved
        db.execute(
            "UPDATE cal_collections SET sync_token = 'http://radicale.org/ns/sync/gone', ctag = 'x'"
        )
    rt = runtime(book, home)
    assert titles(rt) == ["E1", "E2", "E3", "E4", "E5"]
    assert [m for m, _ in rt.sent].count("REPORT") == 2  # refused, then everything
    rt.store.close()  # type: ignore[union-attr]

    # the same name on another server (or user): the old rows are not its rows
    with radicale() as other:
        make_calendar(other, "alice", "work", "Work")
        put_object(
            other, "alice", "/alice/work/x.ics", vevent("x", 9, "Other server"), "text/calendar"
        )
        book.add(
            Account(name="work", kind="caldav", url=other.url + "/", username="alice"),
            "secret",
            replace=True,
        )
        rt = runtime(book, home)
        assert titles(rt) == ["Other server"]
        rt.store.forget("work")
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM cal_objects").fetchone() == (0,)
            assert db.execute("SELECT count(*) FROM listings").fetchone() == (0,)
        rt.store.close()  # type: ignore[union-attr]


def test_a_broken_cache_file_is_set_aside(book: AccountStore, home: Path, server: Radicale) -> None:
    path = personal_cache_file(home)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b"not a database at all" * 100)
    book.add(Account(name="work", kind="caldav", url=server.url + "/", username="alice"), "secret")
    rt = runtime(book, home)
    assert len(titles(rt)) == 5
    assert path.with_name(path.name + ".broken").exists()
    rt.store.close()  # type: ignore[union-attr]


def test_a_sync_answer_naming_objects_outside_the_calendar_is_not_believed(
    book: AccountStore, home: Path
) -> None:
    ns = 'xmlns:D="DAV:" xmlns:C="urn:ietf:params:xml:ns:caldav" xmlns:CS="http://calendarserver.org/ns/"'

    def member(href: str, title: str) -> str:
        return (
            f'<D:response><D:href>{href}</D:href><D:propstat><D:prop><D:getetag>"{title}"'
            f"</D:getetag><C:calendar-data>{vevent(title, 3, title)}</C:calendar-data></D:prop>"
            "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
        )

    def route(path: str, query: Any, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if headers.get("X-Method") == "PROPFIND":
            body = (
                f"<D:multistatus {ns}><D:response><D:href>/cal/</D:href><D:propstat><D:prop>"
                "<D:resourcetype><D:collection/><C:calendar/></D:resourcetype>"
                "<D:displayname>Cal</D:displayname><CS:getctag>1</CS:getctag></D:prop>"
                "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response></D:multistatus>"
            )
        elif headers.get("X-Method") == "REPORT":
            body = (
                f"<D:multistatus {ns}><D:sync-token>t1</D:sync-token>"
                + member("/cal/mine.ics", "Mine")
                + member("/other/theirs.ics", "Planted")
                + member("/cal/deeper/x.ics", "Nested")
                + "</D:multistatus>"
            )
        else:
            return 404, {}, b""
        return 207, {"Content-Type": "application/xml"}, body.encode()

    with http_server(route) as srv:
        book.add(Account(name="odd", kind="caldav", url=srv.url + "/cal/", username="u"), "p")
        rt = runtime(book, home)
        assert titles(rt) == ["Mine"]
        rt.store.close()  # type: ignore[union-attr]
