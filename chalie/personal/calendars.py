"""Calendar accounts as one view: CalDAV collections and ICS subscriptions, synced and expanded.

Reading goes through a cache per collection: the collection's CTag (from the
discovery PROPFIND) unchanged means nothing is fetched; changed, one Depth 1
PROPFIND of the ETags says which objects to fetch (one multiget) and which
are gone. An ICS subscription is fetched with ``If-None-Match`` on its ETag.

Listing with no account named reads every calendar account; one that cannot
be reached is named in ``unavailable`` beside the others' events (all of
them failing is the first one's error). Writing needs a CalDAV account: the
named one, else the default.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from chalie.accounts.failure import AccountFailure, AccountSweep
from chalie.accounts.spec import Account, Kind
from chalie.personal import calendar as ical
from chalie.personal.dav import Collection, DavClient, check_href, keep_unchanged
from chalie.personal.runtime import PersonalRuntime

READ_KINDS: tuple[Kind, ...] = ("caldav", "ics")


@dataclass
class CollectionState:
    """What the cache keeps of one collection: per object its ETag and what was read of it."""

    objects: dict[str, tuple[str, ical.Stored]] = field(default_factory=dict)
    sync_token: str = ""


@dataclass
class Window:
    occurrences: list[dict[str, Any]]
    skipped: list[dict[str, str]]
    unavailable: list[dict[str, str]]
    accounts: list[str]


def _from_disk(
    rt: PersonalRuntime, account: Account, coll: Collection
) -> tuple[str, CollectionState] | None:
    """The collection as the cache file last saw it (a restarted daemon starts from there)."""
    if rt.store is None:
        return None
    snap = rt.store.load(account, coll.href)
    if snap is None:
        return None
    state = CollectionState(sync_token=snap.sync_token)
    for href, (etag, text) in snap.objects.items():
        source = ical.Source(account.name, coll.name, href, etag)
        state.objects[href] = (etag, ical.Stored.of(text, source))
    return snap.ctag, state


def _collection_objects(
    rt: PersonalRuntime, dav: DavClient, account: Account, coll: Collection
) -> CollectionState:
    """The collection's objects: from memory or the cache file while its CTag holds, else synced.

    A changed collection is synced by its sync token (RFC 6578: only what changed, with
    its data, in one REPORT; "" the first time: everything); a server that will not is
    compared by ETag (one PROPFIND) and the changed objects fetched (one multiget).
    """
    key = (account.name, coll.href)
    cached = rt.calendars.get(key)
    if cached is None:
        cached = _from_disk(rt, account, coll)
        if cached is not None:
            rt.calendars.put(key, cached[0], cached[1])
    if cached is not None and coll.ctag and cached[0] == coll.ctag:
        state: CollectionState = cached[1]
        return state
    old: CollectionState = cached[1] if cached is not None else CollectionState()
    state = CollectionState()
    changes = dav.sync(coll, old.sync_token, "calendar")
    if changes is None and old.sync_token:
        changes = dav.sync(coll, "", "calendar")  # the old token expired: start over
        old = CollectionState() if changes is not None else old
    if changes is not None:
        complete = not old.sync_token  # the first sync names every object
        if not complete:
            state.objects = dict(old.objects)
        for href in changes.gone:
            state.objects.pop(href, None)
        state.sync_token = changes.token
        got, gone = changes.found, changes.gone
    else:
        etags = dav.etags(coll)
        wanted = keep_unchanged(etags, old.objects, state.objects)
        got = dav.multiget(coll, wanted, "calendar")
        gone = [h for h in old.objects if h not in etags]
        complete = False
    fetched: dict[str, tuple[str, str]] = {}
    for res in got:
        prev = old.objects.get(res.href)
        if prev is not None and res.etag and prev[0] == res.etag and prev[1].text == res.data:
            state.objects[res.href] = prev  # the same object again: keep what was read of it
        else:
            source = ical.Source(account.name, coll.name, res.href, res.etag)
            state.objects[res.href] = (res.etag, ical.Stored.of(res.data, source))
        fetched[res.href] = (res.etag, res.data)
    rt.calendars.put(key, coll.ctag, state)
    if rt.store is not None:
        rt.store.save(
            account,
            coll.href,
            ctag=coll.ctag,
            sync_token=state.sync_token,
            changed=fetched,
            gone=gone,
            complete=complete,
        )
    return state


def _ics_objects(rt: PersonalRuntime, account: Account) -> CollectionState:
    key = (account.name, account.url)
    cached = rt.calendars.get(key)
    creds = rt.accounts.credentials(account)
    with rt.http(creds) as http:
        headers = {"If-None-Match": cached[0]} if cached is not None and cached[0] else {}
        resp = http.request("GET", account.url, headers=headers, ok=(200, 304))
    if resp.status == 304 and cached is not None:
        state: CollectionState = cached[1]
        return state
    source = ical.Source(account.name, account.name, account.url)
    state = CollectionState({account.url: ("", ical.Stored.of(resp.text, source))})
    rt.calendars.put(key, resp.headers.get("etag", ""), state)
    return state


def calendars_of(rt: PersonalRuntime, account: Account) -> list[Collection]:
    with rt.dav_session(account) as dav:
        return dav.collections("calendar")


def window(
    rt: PersonalRuntime,
    account_name: str | None,
    lo: dt.datetime,
    hi: dt.datetime,
    zone: dt.tzinfo,
    calendar_name: str | None = None,
) -> Window:
    """Every occurrence in [lo, hi) of the named account, or of every calendar account."""
    if account_name:
        accounts = [rt.accounts.pick(READ_KINDS, account_name)]
    else:
        accounts = [a for k in READ_KINDS for a in rt.accounts.list(k)]
        if not accounts:
            rt.accounts.pick(READ_KINDS, None)  # raises unknown-account with the set-up hint
    states: list[CollectionState] = []
    sweep = AccountSweep(named=bool(account_name))
    for account in accounts:
        with sweep.reading(account.name):
            if account.kind == "ics":
                if calendar_name is None or calendar_name == account.name:
                    states.append(_ics_objects(rt, account))
                continue
            with rt.dav_session(account) as dav:
                colls = rt.collections(dav, account, "calendar")
                picked = [c for c in colls if calendar_name in (None, c.name, c.href)]
                if not picked and len(colls) == 1:
                    picked = colls  # one calendar: a name that is not its own means it
                if calendar_name is not None and not picked and account_name:
                    raise AccountFailure(
                        "item-not-found",
                        f"no calendar named {calendar_name!r}",
                        account=account.name,
                        valid_values=tuple(c.name for c in colls) or None,
                        param="calendar",
                    )
                for coll in picked:
                    states.append(_collection_objects(rt, dav, account, coll))
    sweep.check(len(accounts))
    if calendar_name is not None and not states and not sweep.failures:
        raise AccountFailure(
            "item-not-found",
            f"no calendar named {calendar_name!r} in any account",
            hint="call without calendar= to read every calendar.",
            param="calendar",
        )
    skipped: list[dict[str, str]] = []
    parsed: list[ical.Parsed] = []
    for state in states:
        for _, stored in state.objects.values():
            if not ical.may_overlap(stored.span, lo, hi):
                continue
            p = stored.get()
            skipped.extend(stored.notes)
            if p is not None:
                parsed.append(p)
    found = ical.expand(parsed, lo, hi, zone, skipped)
    return Window(found, skipped, sweep.unavailable, [a.name for a in accounts])


# -- writing -----------------------------------------------------------------------------


def _writable(rt: PersonalRuntime, account_name: str | None) -> Account:
    if account_name:
        named = rt.accounts.get(account_name)
        if named is not None and named.read_only:
            raise AccountFailure(
                "read-only-account",
                f"{account_name} is an ICS subscription",
                account=account_name,
                param="account",
            )
    return rt.accounts.pick(("caldav",), account_name)


def _target(
    rt: PersonalRuntime, dav: DavClient, account: Account, calendar_name: str | None
) -> Collection:
    colls = rt.collections(dav, account, "calendar")
    if not colls:
        raise AccountFailure("item-not-found", "the account has no calendar", account=account.name)
    if calendar_name is None:
        return colls[0]
    for c in colls:
        if calendar_name in (c.name, c.href):
            return c
    if len(colls) == 1:
        return colls[0]  # one calendar: a name that is not its own ("primary") means it
    raise AccountFailure(
        "item-not-found",
        f"no calendar named {calendar_name!r}",
        account=account.name,
        valid_values=tuple(c.name for c in colls),
        param="calendar",
    )


def create(
    rt: PersonalRuntime,
    account_name: str | None,
    calendar_name: str | None,
    **fields: Any,
) -> dict[str, Any]:
    account = _writable(rt, account_name)
    with rt.dav_session(account) as dav:
        coll = _target(rt, dav, account, calendar_name)
        uid, text = ical.new_event(**fields)
        href = f"{coll.href}{uid.split('@')[0]}.ics"
        etag = dav.put(href, text, "text/calendar", etag=None)
    return {"id": href, "uid": uid, "calendar": coll.name, "account": account.name, "etag": etag}


def _owned(rt: PersonalRuntime, dav: DavClient, account: Account, event_id: str) -> str:
    return check_href(event_id, rt.collections(dav, account, "calendar"), account.name)


def update(
    rt: PersonalRuntime,
    account_name: str | None,
    event_id: str,
    occurrence: dt.date | dt.datetime | None = None,
    **changes: Any,
) -> dict[str, Any]:
    """Change an event (a series as a whole), or with ``occurrence`` one occurrence of it."""
    account = _writable(rt, account_name)
    with rt.dav_session(account) as dav:
        href = _owned(rt, dav, account, event_id)
        current = dav.get(href)
        source = ical.Source(account.name, "", href, current.etag)
        if occurrence is None:
            text = ical.changed_event(current.data, source, **changes)
        else:
            changes.pop("recurrence", None)
            text = ical.changed_occurrence(current.data, source, occurrence, **changes)
        etag = dav.put(href, text, "text/calendar", etag=current.etag)
    out = {"id": href, "account": account.name, "etag": etag}
    if occurrence is not None:
        out["occurrence"] = occurrence.isoformat()
    return out


def delete(
    rt: PersonalRuntime,
    account_name: str | None,
    event_id: str,
    occurrence: dt.date | dt.datetime | None = None,
) -> dict[str, Any]:
    """Delete an event (a series as a whole), or with ``occurrence`` one date of its series."""
    account = _writable(rt, account_name)
    with rt.dav_session(account) as dav:
        href = _owned(rt, dav, account, event_id)
        current = dav.get(href)
        if occurrence is None:
            dav.delete(href, etag=current.etag)
            return {"deleted": href, "account": account.name}
        source = ical.Source(account.name, "", href, current.etag)
        text = ical.without_occurrence(current.data, source, occurrence)
        dav.put(href, text, "text/calendar", etag=current.etag)
    return {"deleted": href, "occurrence": occurrence.isoformat(), "account": account.name}
