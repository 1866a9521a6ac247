"""Contacts: vCards from CardDAV address books (vobject parses and writes them).

Search reads every card of every address book once and keeps them by the
collection's CTag (:class:`chalie.personal.runtime.CollectionCache`), then
matches in memory: a name or email by case-folded substring, a phone number
by its digits (so "+356 2123 4567" finds "21234567"). A card that does not
parse is skipped and named.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

import vobject

from chalie.accounts.failure import AccountFailure, AccountSweep
from chalie.accounts.spec import Account
from chalie.personal.dav import Collection, DavClient, check_href, keep_unchanged
from chalie.personal.runtime import PersonalRuntime

MAX_RESULTS: Final = 50
_DIGITS: Final = re.compile(r"\D+")


@dataclass
class Card:
    id: str
    etag: str
    account: str
    book: str
    name: str
    emails: list[str]
    phones: list[str]
    org: str = ""
    note: str = ""

    def shown(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "emails": self.emails,
            "phones": self.phones,
            "account": self.account,
            "address_book": self.book,
        }
        if self.org:
            out["organization"] = self.org
        if self.note:
            out["note"] = self.note[:500]
        return out


@dataclass
class BookState:
    cards: dict[str, tuple[str, Card | None]] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)


def _values(card: Any, key: str) -> list[str]:
    return [str(item.value) for item in card.contents.get(key, []) if str(item.value).strip()]


def parse_card(text: str, href: str, etag: str, account: str, book: str) -> Card:
    card = vobject.readOne(text)
    fn = _values(card, "fn")
    org = card.contents.get("org")
    org_text = " ".join(org[0].value) if org and isinstance(org[0].value, list) else ""
    return Card(
        id=href,
        etag=etag,
        account=account,
        book=book,
        name=fn[0] if fn else "(no name)",
        emails=_values(card, "email"),
        phones=_values(card, "tel"),
        org=org_text,
        note=(_values(card, "note") or [""])[0],
    )


def _sync(rt: PersonalRuntime, dav: DavClient, account: Account, coll: Collection) -> BookState:
    key = (account.name, coll.href)
    cached = rt.addressbooks.get(key)
    if cached is not None and coll.ctag and cached[0] == coll.ctag:
        state: BookState = cached[1]
        return state
    old: BookState = cached[1] if cached is not None else BookState()
    etags = dav.etags(coll)
    state = BookState()
    wanted = keep_unchanged(etags, old.cards, state.cards)
    for res in dav.multiget(coll, wanted, "addressbook"):
        try:
            state.cards[res.href] = (
                res.etag,
                parse_card(res.data, res.href, res.etag, account.name, coll.name),
            )
        except Exception as exc:  # vobject raises many kinds on a broken card
            state.cards[res.href] = (res.etag, None)
            state.skipped.append({"id": res.href, "reason": f"does not parse: {str(exc)[:120]}"})
    rt.addressbooks.put(key, coll.ctag, state)
    return state


def all_cards(
    rt: PersonalRuntime, account_name: str | None
) -> tuple[list[Card], list[dict[str, str]], list[dict[str, str]]]:
    """(cards, skipped, unavailable) across the named account or every CardDAV account."""
    accounts = (
        [rt.accounts.pick(("carddav",), account_name)]
        if account_name
        else rt.accounts.list("carddav")
    )
    if not accounts:
        rt.accounts.pick(("carddav",), None)
    cards: list[Card] = []
    skipped: list[dict[str, str]] = []
    sweep = AccountSweep(named=bool(account_name))
    for account in accounts:
        with sweep.reading(account.name), rt.dav_session(account) as dav:
            for coll in rt.collections(dav, account, "addressbook"):
                state = _sync(rt, dav, account, coll)
                cards.extend(c for _, c in state.cards.values() if c is not None)
                skipped.extend(state.skipped)
    sweep.check(len(accounts))
    return cards, skipped, sweep.unavailable


def matches(card: Card, query: str) -> bool:
    q = query.casefold().strip()
    if q in card.name.casefold() or any(q in e.casefold() for e in card.emails):
        return True
    if q in card.org.casefold():
        return True
    digits = _DIGITS.sub("", query)
    return len(digits) >= 3 and any(digits in _DIGITS.sub("", p) for p in card.phones)


def _vcard(name: str, emails: list[str], phones: list[str], org: str, note: str, uid: str) -> Any:
    card = vobject.vCard()
    card.add("uid").value = uid
    card.add("fn").value = name
    parts = name.split()
    card.add("n").value = vobject.vcard.Name(
        family=parts[-1] if len(parts) > 1 else "", given=" ".join(parts[:-1]) or name
    )
    for e in emails:
        item = card.add("email")
        item.value = e
        item.type_param = "INTERNET"
    for p in phones:
        card.add("tel").value = p
    if org:
        card.add("org").value = [org]
    if note:
        card.add("note").value = note
    return card


def create(
    rt: PersonalRuntime,
    account_name: str | None,
    book_name: str | None,
    *,
    name: str,
    emails: list[str],
    phones: list[str],
    org: str,
    note: str,
) -> dict[str, Any]:
    account = rt.accounts.pick(("carddav",), account_name)
    with rt.dav_session(account) as dav:
        colls = rt.collections(dav, account, "addressbook")
        target = next((c for c in colls if book_name in (None, c.name, c.href)), None)
        if target is None:
            raise AccountFailure(
                "item-not-found",
                "no such address book",
                account=account.name,
                valid_values=tuple(c.name for c in colls) or None,
                param="address_book",
            )
        uid = str(uuid.uuid4())
        href = f"{target.href}{uid}.vcf"
        dav.put(
            href, _vcard(name, emails, phones, org, note, uid).serialize(), "text/vcard", etag=None
        )
    return {"id": href, "name": name, "account": account.name, "address_book": target.name}


def update(
    rt: PersonalRuntime,
    account_name: str | None,
    card_id: str,
    *,
    name: str | None,
    emails: list[str] | None,
    phones: list[str] | None,
    org: str | None,
    note: str | None,
) -> dict[str, Any]:
    account = rt.accounts.pick(("carddav",), account_name)
    with rt.dav_session(account) as dav:
        href = check_href(card_id, rt.collections(dav, account, "addressbook"), account.name)
        current = dav.get(href)
        try:
            old = parse_card(current.data, href, current.etag, account.name, "")
            uid = str(vobject.readOne(current.data).uid.value)
        except Exception:  # a card we cannot read is not one we overwrite
            raise AccountFailure(
                "account-bad-response", "the stored card does not parse", account=account.name
            ) from None
        card = _vcard(
            name if name is not None else old.name,
            emails if emails is not None else old.emails,
            phones if phones is not None else old.phones,
            org if org is not None else old.org,
            note if note is not None else old.note,
            uid,
        )
        dav.put(href, card.serialize(), "text/vcard", etag=current.etag)
    return {"id": href, "name": card.fn.value, "account": account.name}
