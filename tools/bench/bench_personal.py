"""The personal abilities' figures, each beside its floor and the ratio.

- calendar month view over 500 events (450 single, 50 weekly series), through the
  dispatcher (gate and trail included), Radicale on loopback. Target: <= 200 ms.
  Floor: one bare PROPFIND (Depth 0) to the same Radicale. Three figures: cold (a
  daemon that never saw the calendar: discovery, then one sync-collection REPORT
  bringing every object), first call after a restart (a new runtime and dispatcher on
  the same home: the cache file holds the objects, one PROPFIND checks the CTags),
  warm (the same daemon again: one PROPFIND).
- email search in a 10,000-message mailbox (Dovecot on loopback), through the
  dispatcher. Target: <= 500 ms. Floor: one IMAP NOOP on a logged-in session.
- reading one message (~100 KB) through the dispatcher. Target: <= 50 ms plus the
  transfer; floor: the transfer itself (a bare UID FETCH BODY.PEEK[] of it).

Run: ``python tools/bench/bench_personal.py [--calls 20] [--only calendar|email]``
(needs radicale, dovecot-imapd).

Calendar, measured 2026-12-01 22:10 UTC on the shared 2-core machine (load ~6), --calls 20:
cold p50 186.0 ms (58.0 ms of CPU in this process), first after a restart 78.5 ms
(23.5 ms CPU, n=5), warm 44.9 ms (10.9 ms CPU); floor 16.0 ms. All within 200. Before
(same machine, 21:34, load ~5): cold 463 ms, warm 112 ms with 55.7 ms CPU a call (the
note's quieter figures: 607 / 190). What changed: the first sync is one RFC 6578
sync-collection REPORT (was a Depth 1 ETag PROPFIND plus a multiget); the candidates
are read by chalie/personal/vevent.py and expanded with dateutil's rrule
(recurring-ical-events only for what it declines; CPU for all 500 objects and the 50
series over March: reading 14 ms against icalendar's 120, expanding 7 against 26);
the synced objects live in <home>/cache/calendars.db, so a restart costs one PROPFIND
and a read of the file; the personal HTTP clients share the process's one TLS context
(each new httpx2 client had loaded the CA bundle: ~20-70 ms of CPU a call);
untrusted.clean returns printable ASCII as it is (it had normalised every one of the
~5,500 strings a month view holds).

Email (not re-measured since), 2026-12-01, load 6.8 to 8.5, --calls 20: mail search
by subject in 10,000 messages p50 38.7 ms, by body text 124.7 ms (Dovecot with no FTS
index scans the bodies; 521.7 ms at load 12), within 500; reading a 100 KB message
23.8 ms, 23.1 ms over the bare transfer (0.7 ms), within 50 + transfer. A mailbox
seeded by dropping files into the Maildir instead made every fetch in a new session
cost about a second (Dovecot re-reading files it did not name); the APPEND-seeded one
is what a real mailbox is like.
"""

from __future__ import annotations

import argparse
import email.message
import email.utils
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from abilities.calendar import Calendar
from abilities.email import Email
from actors.calls.dispatcher import DispatcherActor, submit
from actors.gate.policy import PolicyActor
from chalie.accounts.spec import Account
from chalie.accounts.store import AccountStore
from chalie.calls.registry import Registry
from chalie.personal.runtime import PersonalRuntime, PersonalSettings
from chalie.services import Services
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, TurnContext
from tools import personal_servers as servers


def ms(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def p50_cpu(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """(p50 wall-clock ms, this process's CPU ms per call): the machine may be shared."""
    cpu = time.process_time()
    samples = ms(fn, n)
    return statistics.median(samples), (time.process_time() - cpu) / n * 1000


def line(
    label: str, figure: float, floor_label: str, floor: float, target: float, cpu: float = -1
) -> None:
    verdict = "within" if figure <= target else "ABOVE"
    spent = f" (cpu here {cpu:.1f} ms/call)" if cpu >= 0 else ""
    print(
        f"  {label}: p50 {figure:.1f} ms{spent}   floor ({floor_label}) {floor:.2f} ms   "
        f"ratio {figure / floor:.0f}   {verdict} the {target:g} ms target"
    )


def event(i: int, rng: random.Random) -> str:
    day = 1 + i % 28
    month = 1 + (i // 28) % 12
    hour = 8 + i % 9
    zone = rng.choice(["Europe/Berlin", "Europe/Malta", "America/New_York", "UTC"])
    rule = "RRULE:FREQ=WEEKLY;COUNT=40\n" if i < 50 else ""
    tz = "" if zone == "UTC" else f";TZID={zone}"
    z = "Z" if zone == "UTC" else ""
    return (
        "BEGIN:VCALENDAR\nVERSION:2.0\nPRODID:bench\nBEGIN:VEVENT\n"
        f"UID:bench-{i}@bench\nDTSTAMP:20250101T000000Z\n"
        f"DTSTART{tz}:2025{month:02d}{day:02d}T{hour:02d}0000{z}\n"
        f"DTEND{tz}:2025{month:02d}{day:02d}T{hour:02d}4500{z}\n"
        f"{rule}SUMMARY:Event {i}\nLOCATION:Room {i % 7}\nEND:VEVENT\nEND:VCALENDAR\n"
    )


def dispatcher(home: Path, rt: PersonalRuntime, tools: list[type[Any]]) -> tuple[Any, Any]:
    registry = Registry()
    for cls in tools:
        registry.add(cls, source="bench")
    bus = EventBus()
    policy = PolicyActor.start(home / "chalie.db", bus)
    for perm in ("calendar.list", "email.search", "email.read"):
        policy.proxy().set("chat", perm, "allow").get()
    disp = DispatcherActor.start(
        registry,
        Services(personal=rt),
        home / "chalie.db",
        policy,
        None,
        bus,
    )
    return disp, policy


def call(disp: Any, tool: str, args: dict[str, Any]) -> Any:
    ctx = TurnContext(conversation_id="bench", turn_id="t1", channel="chat", injected=(tool,))
    c = ToolCall(call_id="c1", tool=tool, arguments={"act_summary": "bench", **args}, context=ctx)
    out = submit(disp, c).result(60)
    assert out.status == "success", out.envelope[:500]
    return out


def bench_calendar(n: int) -> None:
    import httpx2

    home = Path(tempfile.mkdtemp(prefix="bench-personal-"))
    rng = random.Random(7)
    with servers.radicale() as srv:
        servers.make_calendar(srv, "alice", "work", "Work")
        with httpx2.Client(auth=("alice", "secret"), timeout=30) as c:
            for i in range(500):
                r = c.put(
                    f"{srv.url}/alice/work/e{i}.ics",
                    content=event(i, rng).encode(),
                    headers={"Content-Type": "text/calendar"},
                )
                assert r.status_code in (201, 204), r.status_code
            body = (
                b'<?xml version="1.0"?><D:propfind xmlns:D="DAV:">'
                b"<D:prop><D:getetag/></D:prop></D:propfind>"
            )
            floor = statistics.median(
                ms(
                    lambda: c.request(
                        "PROPFIND", f"{srv.url}/alice/work/", content=body, headers={"Depth": "0"}
                    ),
                    n,
                )
            )
        book = AccountStore(home / "chalie.db", home)
        book.add(Account(name="work", kind="caldav", url=srv.url + "/", username="alice"), "secret")
        book.close()
        args = {"action": "list", "start": "2025-03-01", "end": "2025-03-31"}

        def daemon() -> tuple[Any, Any, PersonalRuntime]:
            # what the composition root builds: the accounts, and the cache file in the home
            rt = PersonalRuntime.open(
                home / "chalie.db", home, PersonalSettings(zone="Europe/Malta")
            )
            disp, policy = dispatcher(home, rt, [Calendar])
            return disp, policy, rt

        def once(disp: Any) -> tuple[float, float, Any]:
            cpu, t = time.process_time(), time.perf_counter()
            out = call(disp, "calendar", args)
            return (time.perf_counter() - t) * 1000, (time.process_time() - cpu) * 1000, out

        disp, policy, rt = daemon()
        try:
            cold, cold_cpu, out = once(disp)  # never seen: everything fetched and stored
            count = out.envelope.count('"id":')
        finally:
            disp.stop()
            policy.stop()
            rt.close()
        restarts: list[tuple[float, float]] = []
        for _ in range(max(3, n // 4)):  # a new daemon each time: memory empty, the file kept
            disp, policy, rt = daemon()
            try:
                wall, cpu, _ = once(disp)
                restarts.append((wall, cpu))
                if len(restarts) == 1:
                    warm, warm_cpu = p50_cpu(lambda d=disp: call(d, "calendar", args), n)
            finally:
                disp.stop()
                policy.stop()
                rt.close()
    restart = statistics.median(w for w, _ in restarts)
    restart_cpu = statistics.median(c for _, c in restarts)
    print(f"calendar month view, 500 events (50 weekly series), {count} occurrences in March:")
    line("cold (never seen: one sync REPORT of all)", cold, "bare PROPFIND", floor, 200, cold_cpu)
    line(
        f"first after a restart (cache file, CTag check), n={len(restarts)}",
        restart,
        "bare PROPFIND",
        floor,
        200,
        restart_cpu,
    )
    line(f"warm (CTag revalidated), n={n}", warm, "bare PROPFIND", floor, 200, warm_cpu)


def bench_email(n: int) -> None:
    from imapclient import IMAPClient

    home = Path(tempfile.mkdtemp(prefix="bench-personal-"))
    with servers.dovecot() as imap:
        rng = random.Random(3)
        words = "budget hiring offsite agenda invoice lunch report travel review launch".split()
        big = "x" * 100_000
        t = time.perf_counter()
        with IMAPClient("127.0.0.1", port=imap.port, ssl=False) as seed:
            seed.login("alice", "secret")
            batch: list[dict[str, Any]] = []
            for i in range(10_000):
                m = email.message.EmailMessage()
                m["From"] = f"Person {i % 300} <p{i % 300}@example.com>"
                m["To"] = "alice@example.com"
                m["Subject"] = f"{rng.choice(words)} {rng.choice(words)} #{i}"
                m["Date"] = email.utils.formatdate(1.7e9 + i * 600)
                m["Message-ID"] = f"<m{i}@bench>"
                m.set_content(big if i == 5000 else f"Message {i} about {rng.choice(words)}.")
                batch.append({"msg": bytes(m), "flags": [b"\\Seen"] if i % 10 else []})
                if len(batch) == 500:
                    seed.multiappend("INBOX", batch)
                    batch = []
        seeded = time.perf_counter() - t
        book = AccountStore(home / "chalie.db", home)
        book.add(
            Account(
                name="mail",
                kind="imap",
                host="127.0.0.1",
                port=imap.port,
                security="none",
                username="alice",
            ),
            "secret",
        )
        rt = PersonalRuntime(book, PersonalSettings())
        disp, policy = dispatcher(home, rt, [Email])
        with IMAPClient("127.0.0.1", port=imap.port, ssl=False) as c:
            c.login("alice", "secret")
            t = time.perf_counter()
            c.select_folder("INBOX", readonly=True)  # Dovecot indexes the new mailbox here
            index_ms = (time.perf_counter() - t) * 1000
            noop = statistics.median(ms(c.noop, n))
            target = c.search(["HEADER", "Message-ID", "<m5000@bench>"])[0]
            transfer = statistics.median(ms(lambda: c.fetch([target], ["BODY.PEEK[]"]), n))
        try:
            search = {"action": "search", "subject": "invoice", "limit": 20}
            call(disp, "email", search)
            s, s_cpu = p50_cpu(lambda: call(disp, "email", search), n)
            text = {"action": "search", "text": "hiring", "unread": False, "limit": 20}
            t2, t2_cpu = p50_cpu(lambda: call(disp, "email", text), n)
            read = {"action": "read", "id": target}
            r, r_cpu = p50_cpu(lambda: call(disp, "email", read), n)
        finally:
            disp.stop()
            policy.stop()
            book.close()
    print(
        f"email, 10,000 messages in INBOX (APPENDed in {seeded:.0f} s; then a first SELECT "
        f"{index_ms:.0f} ms):"
    )
    line(f"search subject=invoice, 20 newest, n={n}", s, "IMAP NOOP", noop, 500, s_cpu)
    line(f"search text=hiring (body), n={n}", t2, "IMAP NOOP", noop, 500, t2_cpu)
    over = r - transfer
    print(
        f"  read one 100 KB message: p50 {r:.1f} ms (cpu here {r_cpu:.1f} ms/call)   "
        "floor (the transfer, a bare FETCH) "
        f"{transfer:.1f} ms   over the transfer {over:.1f} ms   "
        f"{'within' if over <= 50 else 'ABOVE'} the 50 ms + transfer target"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--only", choices=("calendar", "email"), default=None)
    args = parser.parse_args()
    if args.only != "email":
        bench_calendar(args.calls)
    if args.only == "calendar":
        return
    if servers.have_dovecot():
        bench_email(args.calls)
    else:
        print("email: skipped (no dovecot-imapd)")


if __name__ == "__main__":
    main()
