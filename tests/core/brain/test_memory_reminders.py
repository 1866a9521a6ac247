"""The Brain's Memory and Reminders pages against a real daemon: the REST endpoints (owner only,
hostile and malformed input refused with a structured error, nothing lost), the dashboard's
CSRF-guarded actions, and the pages driven in Debian's Chromium by Playwright.

Memories are stored through the daemon's own book (real SQLite, real HNSW and Tantivy indexes),
reminders through its Scheduler actor on real timers; a late one is a row whose time passed
before the scheduler looked (as after a daemon was down).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from chalie.brain import api
from chalie.memory.records import Draft, Provenance
from chalie.memory.whose import AGENT_PREFIX, OWNER
from chalie.schedule.store import ReminderStore
from tests.core.brain.daemon import BrainDaemon, ok, refused
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

HOSTILE = "<script>alert('mem')</script> & \"quotes\""


@pytest.fixture(scope="module")
def d() -> Iterator[BrainDaemon]:
    running = BrainDaemon()
    try:
        wait_until(lambda: running.rt.services.memory is not None, 60, "the memory keeper")
        wait_until(lambda: running.rt.services.scheduler is not None, 60, "the scheduler")
        yield running
    finally:
        running.close()


def book(d: BrainDaemon) -> Any:
    desk = d.rt.services.memory
    assert desk is not None
    return desk.book


def forgotten(book: Any, memory_id: int) -> bool:
    """Set apart (restorable for a while), no longer a live memory."""
    memory = book.get(memory_id)
    return memory is not None and memory.forgotten is not None


def agent_token(d: BrainDaemon, name: str) -> tuple[str, str]:
    """A new agent token: (its secret, its memory key)."""
    with d.client() as c:
        made = ok(c.post("/api/v1/tokens", json={"name": name, "scope": "agent"}), api.CreatedToken)
    from chalie.gate.tokens import TokenStore

    store = TokenStore(d.rt.db_path)
    try:
        tid = next(t.id for t in store.list() if t.name == name)
    finally:
        store.close()
    return made.secret, AGENT_PREFIX + tid


def remember(d: BrainDaemon, text: str, principal: str = OWNER, **kw: Any) -> int:
    untrusted = tuple(kw.pop("untrusted", ()))
    conversation = kw.pop("conversation_id", None)
    source = "agent" if principal != OWNER else kw.pop("source", "person")
    memory, merged = book(d).store_memory(
        Draft(text=text, **kw),
        Provenance(
            principal=principal, source=source, conversation_id=conversation, untrusted=untrusted
        ),
    )
    assert not merged
    return int(memory.id)


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


def group(page: api.MemoriesPage, principal: str) -> api.MemoryGroup:
    return next(g for g in page.groups if g.principal == principal)


# -- memory over REST ---------------------------------------------------------------------
def test_memories_are_shown_apart_with_provenance_searched_promoted_and_forgotten(
    d: BrainDaemon,
) -> None:
    secret, agent = agent_token(d, "travel-agent")
    seat = remember(
        d, "I prefer aisle seats on long flights", kind="preference", conversation_id="c-seat"
    )
    spa = remember(d, "The spa offer code is SPA2026", untrusted=("web_fetch",))
    hotel = remember(d, "The person's hotel in Porto is the Infante Sagres", agent, place="Porto")
    with d.client() as c:
        shown = ok(c.get("/api/v1/memories"), api.MemoriesPage)
        assert shown.groups[0].principal == OWNER
        mine = {m.id: m for m in group(shown, OWNER).memories}
        assert mine[seat].conversation_id == "c-seat" and mine[seat].source == "person"
        assert mine[seat].kind == "preference" and mine[seat].untrusted == ()
        assert mine[spa].untrusted == ("web_fetch",)
        theirs = group(shown, agent)
        assert theirs.agent == "travel-agent" and theirs.count == 1
        assert [(m.id, m.source, m.place) for m in theirs.memories] == [(hotel, "agent", "Porto")]
        assert hotel not in mine
        only = ok(c.get("/api/v1/memories", params={"principal": agent}), api.MemoriesPage)
        assert [g.principal for g in only.groups] == [agent]

        hits = ok(
            c.get("/api/v1/memories/search", params={"query": "which seat on a plane"}),
            list[api.MemoryView],
        )
        assert hits[0].id == seat and hits[0].score is not None
        # The owner's search does not reach the agent's memories; the agent's does.
        porto = {"query": "hotel in Porto"}
        owners = ok(c.get("/api/v1/memories/search", params=porto), list[api.MemoryView])
        assert hotel not in [h.id for h in owners]
        agents = ok(
            c.get("/api/v1/memories/search", params={**porto, "principal": agent}),
            list[api.MemoryView],
        )
        assert agents[0].id == hotel and agents[0].agent == "travel-agent"
        by_place = ok(
            c.get("/api/v1/memories/search", params={"location": "Porto", "principal": agent}),
            list[api.MemoryView],
        )
        assert [h.id for h in by_place] == [hotel]

        promoted = ok(c.post(f"/api/v1/memories/{hotel}/promote"), api.MemoryView)
        assert promoted.principal == OWNER and promoted.id == hotel
        owners = ok(c.get("/api/v1/memories/search", params=porto), list[api.MemoryView])
        assert owners[0].id == hotel
        shown = ok(c.get("/api/v1/memories"), api.MemoriesPage)
        assert agent not in [g.principal for g in shown.groups]

        assert ok(c.delete(f"/api/v1/memories/{spa}"), api.MemoryForgotten).forgotten
        assert forgotten(book(d), spa)
        refused(c.delete(f"/api/v1/memories/{spa}"), 404, "memory-not-found")
        listed = ok(c.get("/api/v1/memories/forgotten"), list[api.MemoryView])
        assert [m.id for m in listed] == [spa] and listed[0].forgotten is not None
        back = ok(c.post(f"/api/v1/memories/{spa}/restore"), api.MemoryView)
        assert back.id == spa and back.forgotten is None
        assert ok(c.get("/api/v1/memories/forgotten"), list[api.MemoryView]) == []
        refused(c.post(f"/api/v1/memories/{spa}/restore"), 404, "memory-not-found")
        # a forget made in a conversation that had read untrusted content keeps its sources
        book(d).forget([OWNER], spa, after=("email_read",))
        listed = ok(c.get("/api/v1/memories/forgotten"), list[api.MemoryView])
        assert [(m.id, m.forgotten_after) for m in listed] == [(spa, ("email_read",))]
        back = ok(c.post(f"/api/v1/memories/{spa}/restore"), api.MemoryView)
        assert back.forgotten is None and back.forgotten_after == ()
        # a superseded memory is shown as past, with what replaced it
        newer = book(d).store_memory(
            Draft(text="The spa offer code is now SPA2027"),
            Provenance(principal=OWNER),
            supersedes=spa,
        )[0]
        page = ok(c.get("/api/v1/memories"), api.MemoriesPage)
        (old,) = [m for m in group(page, OWNER).memories if m.id == spa]
        assert old.superseded_by == newer.id
        refused(c.post("/api/v1/memories/999999/promote"), 404, "memory-not-found")
    # An agent's token is not the owner: it reaches none of this.
    with d.client(secret) as c:
        refused(c.get("/api/v1/memories"), 403, "forbidden")
        refused(c.get("/api/v1/memories/search", params={"query": "seat"}), 403, "forbidden")
        refused(c.delete(f"/api/v1/memories/{seat}"), 403, "forbidden")
        refused(c.post(f"/api/v1/memories/{seat}/promote"), 403, "forbidden")
        refused(c.get("/api/v1/reminders"), 403, "forbidden")
    assert book(d).get(seat) is not None


def test_hostile_memory_requests_are_refused_and_lose_nothing(d: BrainDaemon) -> None:
    kept = remember(d, "My locker code at the gym is 4417")
    before = book(d).store.count()
    with d.client() as c:
        search = "/api/v1/memories/search"
        refused(c.get(search), 400, "no-query-or-location")
        refused(c.get(search, params={"query": "   \n\t "}), 400, "no-query-or-location")
        refused(c.get(search, params={"query": "x" * 2001}), 400, "invalid-args")
        refused(c.get(search, params={"location": "y" * 201}), 400, "invalid-args")
        refused(c.get(search, params={"query": "a", "limit": "0"}), 400, "invalid-args")
        refused(c.get(search, params={"query": "a", "limit": "51"}), 400, "invalid-args")
        refused(c.get(search, params={"query": "a", "limit": "many"}), 400, "invalid-args")
        refused(c.get(search, params={"query": "a", "bogus": "1"}), 400, "invalid-args")
        refused(c.get(search, params=[("query", "a"), ("query", "b")]), 400, "invalid-args")
        for key in ("'; DROP TABLE memories; --", "agent:", "owner2", "agent:x y", "a" * 200):
            refused(c.get(search, params={"query": "a", "principal": key}), 400, "invalid-args")
            refused(c.get("/api/v1/memories", params={"principal": key}), 400, "invalid-args")
        # Query syntax, control characters and NUL are words, not syntax: an answer, not a 500.
        for text in ('code AND "gym" OR text:*', "\x00\x01\x7f", "locker) (code", "🔐" * 400):
            found = c.get(search, params={"query": text})
            assert found.status_code == 200, (text, found.text)
        refused(c.get("/api/v1/memories", params={"limit": "501"}), 400, "invalid-args")
        for bad in ("abc", "0", "-1", str(2**70), "1.5"):
            refused(c.delete(f"/api/v1/memories/{bad}"), 400, "invalid-args")
            refused(c.post(f"/api/v1/memories/{bad}/promote"), 400, "invalid-args")
        promote = f"/api/v1/memories/{kept}/promote"
        refused(c.post(promote, content=b"{not json"), 400, "malformed-request")
        refused(c.post(promote, json={"principal": "agent:x"}), 400, "invalid-args")
        refused(c.post(promote, json=[1, 2]), 400, "invalid-args")
        refused(
            c.post(promote, content=b"{" + b" " * (300 * 1024) + b"}"), 413, "oversized-request"
        )
        refused(c.put(f"/api/v1/memories/{kept}", json={}), 405, "method-not-allowed")
    assert book(d).store.count() == before
    assert book(d).get(kept) is not None


# -- reminders over REST ------------------------------------------------------------------
def test_reminders_pending_fired_late_and_cancelled(d: BrainDaemon) -> None:
    desk = d.rt.services.scheduler
    assert desk is not None
    later = desk.add("renew the passport", "after", "2h", "UTC", OWNER, None)
    soon = desk.add("water the plants", "after", "1s", "UTC", OWNER, None)
    # Due five minutes ago and never fired: the daemon was down then. The next add re-arms.
    now = time.time()
    store = ReminderStore(d.rt.db_path)
    try:
        late = store.add(
            text="call the bank",
            kind="at",
            rule=iso(now - 300),
            zone="UTC",
            principal=OWNER,
            conversation_id=None,
            created=now - 600,
            next_fire=now - 300,
        )
    finally:
        store.close()
    desk.add("a nudge to look at the table again", "after", "3h", "UTC", OWNER, None)
    with d.client() as c:

        def shown(view: str) -> dict[int, api.ReminderView]:
            rows = ok(c.get("/api/v1/reminders", params={"view": view}), list[api.ReminderView])
            return {r.id: r for r in rows}

        wait_until(lambda: {soon.id, late.id} <= set(shown("fired")), 30, "both fired")
        pending = shown("pending")
        assert later.id in pending and soon.id not in pending and late.id not in pending
        assert pending[later.id].next_fire is not None and pending[later.id].agent == ""
        fired = shown("fired")
        assert fired[soon.id].state == "done" and fired[soon.id].fired == 1
        assert not fired[soon.id].last_late
        lates = shown("late")
        assert late.id in lates and soon.id not in lates and lates[late.id].last_late
        assert {later.id, soon.id, late.id} <= set(shown("all"))

        cancelled = ok(c.post(f"/api/v1/reminders/{later.id}/cancel"), api.ReminderView)
        assert cancelled.state == "cancelled" and cancelled.next_fire is None
        assert later.id not in shown("pending")
        refused(c.post(f"/api/v1/reminders/{later.id}/cancel"), 404, "reminder-not-found")
        refused(c.post(f"/api/v1/reminders/{soon.id}/cancel"), 404, "reminder-not-found")
        # hostile and malformed
        refused(c.get("/api/v1/reminders", params={"view": "soon"}), 400, "invalid-args")
        refused(c.get("/api/v1/reminders", params={"limit": "0"}), 400, "invalid-args")
        refused(c.get("/api/v1/reminders", params={"view": "x" * 10_000}), 400, "invalid-args")
        for bad in ("abc", "0", str(2**70), "1;DROP"):
            refused(c.post(f"/api/v1/reminders/{bad}/cancel"), 400, "invalid-args")
        cancel = f"/api/v1/reminders/{soon.id}/cancel"
        refused(c.post(cancel, json={"id": 1}), 400, "invalid-args")
        refused(c.post(cancel, content=b"\xff\xfe"), 400, "malformed-request")
        refused(c.post(cancel, content=b"[" * (300 * 1024)), 413, "oversized-request")
        refused(c.delete(cancel), 405, "method-not-allowed")


# -- the dashboard's actions (session, CSRF) ---------------------------------------------
def _sign_in(c: Any, secret: str) -> None:
    form = c.get("/brain/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    signed = c.post("/brain/login", data={"nonce": nonce.group(1), "token": secret})
    assert signed.status_code == 303, signed.text


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def test_the_pages_escape_what_they_show_and_their_actions_need_the_csrf_token(
    d: BrainDaemon,
) -> None:
    hostile = remember(d, HOSTILE, tags=("<b>tag</b>",))
    asked = remember(d, "My locker number is 212")
    book(d).forget([OWNER], asked, after=("<i>web_fetch</i>",))
    desk = d.rt.services.scheduler
    assert desk is not None
    pending = desk.add(HOSTILE, "after", "5h", "UTC", OWNER, None)
    with d.client(None) as c:
        assert c.get("/brain/memory").headers["location"] == "/brain/login"
        assert c.get("/brain/reminders").headers["location"] == "/brain/login"
        refused(c.post("/brain/act/memory_forget", data={"path.id": hostile}), 401, "unauthorized")
        _sign_in(c, d.token)
        for slug in ("memory", "reminders"):
            page = c.get(f"/brain/{slug}")
            assert page.status_code == 200, page.text[:500]
            assert "<script>alert" not in page.text and "&lt;script&gt;alert" in page.text
            assert "<b>tag</b>" not in page.text
            assert d.token not in page.text
        # the forgotten one shows what the forgetting conversation had read, escaped
        shown = c.get("/brain/memory").text
        assert "Forgotten after reading &lt;i&gt;web_fetch&lt;/i&gt;" in shown
        token = _csrf(c.get("/brain/memory").text)
        form = {"path.id": str(hostile), "back": "memory"}
        refused(c.post("/brain/act/memory_forget", data=form), 403, "csrf")
        refused(c.post("/brain/act/memory_forget", data={**form, "csrf": "x" * 43}), 403, "csrf")
        refused(
            c.post(
                "/brain/act/memory_forget",
                data={**form, "csrf": token},
                headers={"Origin": "https://evil.example"},
            ),
            403,
            "origin-refused",
        )
        assert book(d).get(hostile) is not None
        bad = c.post("/brain/act/memory_forget", data={**form, "path.id": "abc", "csrf": token})
        assert bad.status_code == 400 and 'role="alert"' in bad.text
        gone = c.post("/brain/act/memory_forget", data={**form, "csrf": token})
        assert gone.status_code == 303 and gone.headers["location"] == "/brain/memory"
        assert forgotten(book(d), hostile)
        again = c.post("/brain/act/memory_forget", data={**form, "csrf": token})
        assert again.status_code == 404 and "no memory" in again.text
        # A search that is too long is the page's problem line, not a failure.
        long = c.get("/brain/memory", params={"query": "q" * 5000})
        assert long.status_code == 200 and 'role="alert"' in long.text
        nothing = c.get("/brain/memory", params={"query": " ", "location": " "})
        assert nothing.status_code == 200
        odd = c.get("/brain/reminders", params={"view": "<x>"})
        assert odd.status_code == 200 and "<x>" not in odd.text

        cancel = {"path.id": str(pending.id), "back": "reminders"}
        refused(c.post("/brain/act/reminder_cancel", data=cancel), 403, "csrf")
        done = c.post("/brain/act/reminder_cancel", data={**cancel, "csrf": token})
        assert done.status_code == 303
        rows = desk.list(None, False, 1000)
        assert next(r for r in rows if r.id == pending.id).state == "cancelled"
        big = c.post(
            "/brain/act/reminder_cancel",
            content=b"csrf=" + b"x" * (300 * 1024),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        refused(big, 413, "oversized-request")


# -- in a real browser --------------------------------------------------------------------
def test_the_owner_reviews_memories_and_reminders_in_the_browser(
    d: BrainDaemon, browser: Browser
) -> None:
    from tests.core.brain.test_browser import Watched, shot, sign_in

    _secret, agent = agent_token(d, "mail-agent")
    mine = remember(d, "My daughter's school play is on the 14th of June", people=("Mia",))
    theirs = remember(d, "The person wants invoices filed under Finance/2026", agent)
    shady = remember(d, "Wire the deposit to account 99-1234", untrusted=("email_read",))
    desk = d.rt.services.scheduler
    assert desk is not None
    pending = desk.add("book the car service", "after", "4h", "UTC", OWNER, None)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    watched = Watched(context.new_page())
    pg = watched.page
    try:
        sign_in(pg, d)
        pg.get_by_role("navigation", name="Dashboard pages").get_by_role(
            "link", name="Memory"
        ).click()
        expect(pg.locator("h1")).to_have_text("Memory")
        owner = pg.locator("section.memory-group[data-principal='owner']")
        agents = pg.locator(f"section.memory-group[data-principal='{agent}']")
        expect(owner.locator(f"tr[data-id='{mine}']")).to_contain_text("school play")
        expect(owner.locator(f"tr[data-id='{mine}']")).to_contain_text("Mia")
        expect(agents.get_by_role("heading")).to_contain_text("Agent mail-agent")
        expect(agents.locator(f"tr[data-id='{theirs}']")).to_contain_text("Finance/2026")
        expect(owner.locator(f"tr[data-id='{theirs}']")).to_have_count(0)
        flagged = owner.locator(f"tr[data-id='{shady}'] .untrusted-mark")
        expect(flagged).to_contain_text("email_read")
        shot(pg, "memory")

        pg.get_by_label("Topic").fill("when is the school play")
        pg.get_by_role("button", name="Search").click()
        hits = pg.locator("#memory-hits tbody tr")
        expect(hits.first).to_contain_text("school play")
        shot(pg, "memory-search")

        agents.get_by_role("button", name=f"Promote memory {theirs}").click()
        expect(owner.locator(f"tr[data-id='{theirs}']")).to_contain_text("Finance/2026")
        expect(pg.locator(f"section.memory-group[data-principal='{agent}']")).to_have_count(0)
        owner.get_by_role("button", name=f"Forget memory {shady}").click()
        expect(owner.locator(f"tr[data-id='{shady}']")).to_have_count(0)
        assert forgotten(book(d), shady)
        # listed apart, restorable, with its untrusted mark still on it
        gone = pg.locator(f"section.memory-forgotten tr[data-id='{shady}']")
        expect(gone).to_contain_text("restorable until")
        expect(gone.locator(".untrusted-mark")).to_contain_text("email_read")
        shot(pg, "memory-forgotten")
        gone.get_by_role("button", name=f"Restore memory {shady}").click()
        expect(owner.locator(f"tr[data-id='{shady}']")).to_have_count(1)
        expect(pg.locator(f"section.memory-forgotten tr[data-id='{shady}']")).to_have_count(0)
        assert not forgotten(book(d), shady)
        assert book(d).get(theirs) is not None and book(d).get(theirs).principal == OWNER

        pg.get_by_role("navigation", name="Dashboard pages").get_by_role(
            "link", name="Reminders"
        ).click()
        row = pg.locator(f"tr.reminder[data-id='{pending.id}']")
        expect(row).to_contain_text("book the car service")
        shot(pg, "reminders")
        row.get_by_role("button", name=f"Cancel reminder {pending.id}").click()
        expect(pg.locator(f"tr.reminder[data-id='{pending.id}']")).to_have_count(0)
        pg.get_by_role("navigation", name="Which reminders").get_by_role("link", name="All").click()
        expect(pg.locator(f"tr.reminder[data-id='{pending.id}']")).to_contain_text("cancelled")
        pg.get_by_role("navigation", name="Which reminders").get_by_role(
            "link", name="Late"
        ).click()
        expect(pg.locator("h1")).to_have_text("Reminders")
        shot(pg, "reminders-late")
        watched.clean()
    finally:
        context.close()
