"""contacts: search the user's CardDAV address books by name, email or phone; show, add, change."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from chalie.ability import Ability
from chalie.accounts.failure import AccountFailure
from chalie.calls.untrusted import success as untrusted_success
from chalie.result import ToolResult

if TYPE_CHECKING:
    from chalie.personal.runtime import PersonalRuntime

Short = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Many = Annotated[list[Short], msgspec.Meta(max_length=20)]


class ContactsParams(msgspec.Struct, forbid_unknown_fields=True):
    """Find, show, add or change a contact."""

    action: Literal["search", "show", "create", "update"] = "search"
    query: Short | None = None
    id: (
        Annotated[str, msgspec.Meta(max_length=1024, description="a contact id from search")] | None
    ) = None
    account: Short | None = None
    address_book: Short | None = None
    name: Short | None = None
    emails: Many | None = None
    phones: Many | None = None
    organization: Short | None = None
    note: Annotated[str, msgspec.Meta(max_length=2000)] | None = None


class Contacts(Ability):
    name = "contacts"
    summary = (
        "The user's own address book: look up a contact's email address or phone number, "
        "find whose phone number it is, and add or update a contact card."
    )
    tooltip = "Contacts: find people, emails, phones"
    examples = (
        "what's Sam's email address",
        "find the phone number for Maria",
        "who has the number 2123 4567",
        "look up John in my contacts",
        "add Anna Borg with email anna@example.com to my contacts",
        "update Sam's phone number to +356 9912 3456",
        "show the contact details for my dentist",
    )
    Params = ContactsParams
    actions = {"search": ("query",), "show": ("id",), "create": ("name",), "update": ("id",)}
    timeout = 60.0

    def run(self, params: ContactsParams) -> ToolResult:
        from chalie.personal.runtime import with_accounts

        return with_accounts(self, lambda rt: self._run(rt, params))

    def _run(self, rt: PersonalRuntime, p: ContactsParams) -> ToolResult:
        from chalie.personal import contacts

        meta = {"action": p.action}
        if p.action == "create":
            assert p.name is not None
            made = contacts.create(
                rt,
                p.account,
                p.address_book,
                name=p.name,
                emails=p.emails or [],
                phones=p.phones or [],
                org=p.organization or "",
                note=p.note or "",
            )
            return ToolResult.success({"created": made}, meta=meta)
        if p.action == "update":
            assert p.id is not None
            fields = (p.name, p.emails, p.phones, p.organization, p.note)
            if all(f is None for f in fields):
                return ToolResult.error(
                    "missing-params",
                    "update needs at least one field to change.",
                    hint="pass name, emails, phones, organization or note with the id.",
                    meta={"param": "name"},
                )
            changed = contacts.update(
                rt,
                p.account,
                p.id,
                name=p.name,
                emails=p.emails,
                phones=p.phones,
                org=p.organization,
                note=p.note,
            )
            return ToolResult.success({"updated": changed}, meta=meta)
        cards, skipped, unavailable = contacts.all_cards(rt, p.account)
        if p.action == "show":
            found = [c for c in cards if c.id == p.id]
            if not found:
                return AccountFailure(
                    "item-not-found", f"no contact with id {str(p.id)[:120]!r}", param="id"
                ).result()
            return untrusted_success(found[0].shown(), meta=meta)
        assert p.query is not None
        hits = [c for c in cards if contacts.matches(c, p.query)]
        hits.sort(key=lambda c: c.name.casefold())
        body = {
            "query": p.query,
            "total": len(hits),
            "contacts": [c.shown() for c in hits[: contacts.MAX_RESULTS]],
        }
        if skipped:
            body["skipped"] = skipped[:20]
        if unavailable:
            body["unavailable"] = unavailable
        # Cards shared with the user (a company directory) are written by others.
        return untrusted_success(body, meta={**meta, "total": len(hits)})
