"""contacts against Radicale address books started by the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import vobject

from abilities.contacts import Contacts, ContactsParams
from chalie.accounts.spec import Account
from chalie.accounts.store import AccountStore
from chalie.calls.untrusted import WARNING_LINE
from chalie.personal.runtime import PersonalRuntime, PersonalSettings
from chalie.result import ToolResult
from chalie.services import Services
from tools.personal_servers import Radicale, make_addressbook, put_object, radicale

pytestmark = pytest.mark.slow


def card(uid: str, name: str, email: str, phone: str) -> str:
    c = vobject.vCard()
    c.add("uid").value = uid
    c.add("fn").value = name
    c.add("n").value = vobject.vcard.Name(family=name.split()[-1], given=name.split()[0])
    c.add("email").value = email
    c.add("tel").value = phone
    return str(c.serialize())


@pytest.fixture(scope="module")
def server() -> Iterator[Radicale]:
    with radicale() as srv:
        make_addressbook(srv, "alice", "contacts", "Contacts")
        for uid, name, email, phone in (
            ("sam", "Sam Lee", "sam@example.com", "+356 2123 4567"),
            ("maria", "Maria Camilleri", "maria@example.org", "+356 9988 7766"),
        ):
            put_object(
                srv,
                "alice",
                f"/alice/contacts/{uid}.vcf",
                card(uid, name, email, phone),
                "text/vcard",
            )
        yield srv


def tool(book: AccountStore, server: Radicale) -> Contacts:
    if book.get("people") is None:
        book.add(
            Account(name="people", kind="carddav", url=server.url + "/", username="alice"), "secret"
        )
    return Contacts(None, Services(personal=PersonalRuntime(book, PersonalSettings())))


def body(result: ToolResult) -> dict[str, Any]:
    assert result.ok, result.body
    assert result.body.startswith(WARNING_LINE + "\n")
    data: dict[str, Any] = json.loads(result.body.split("\n", 1)[1])
    return data


def test_search_by_name_email_and_phone(book: AccountStore, server: Radicale) -> None:
    c = tool(book, server)
    assert [x["name"] for x in body(c.run(ContactsParams(query="sam")))["contacts"]] == ["Sam Lee"]
    by_mail = body(c.run(ContactsParams(query="example.org")))["contacts"]
    assert [x["name"] for x in by_mail] == ["Maria Camilleri"]
    by_phone = body(c.run(ContactsParams(query="21234567")))["contacts"]
    assert by_phone[0]["emails"] == ["sam@example.com"]
    shown = body(c.run(ContactsParams(action="show", id=by_phone[0]["id"])))
    assert shown["phones"] == ["+356 2123 4567"]
    assert body(c.run(ContactsParams(query="nobody-like-this")))["total"] == 0


def test_create_and_update_a_contact(book: AccountStore, server: Radicale) -> None:
    c = tool(book, server)
    made = c.run(ContactsParams(action="create", name="Anna Borg", emails=["anna@example.com"]))
    assert made.ok, made.body
    new_id = json.loads(made.body)["created"]["id"]
    changed = c.run(ContactsParams(action="update", id=new_id, phones=["+356 9912 3456"]))
    assert changed.ok, changed.body
    found = body(c.run(ContactsParams(query="anna")))["contacts"]
    assert [(x["name"], x["emails"], x["phones"]) for x in found] == [
        ("Anna Borg", ["anna@example.com"], ["+356 9912 3456"])
    ]
    outside = c.run(ContactsParams(action="update", id="/bob/contacts/x.vcf", name="x"))
    assert outside.code == "item-not-found"
    assert c.classify({"action": "update", "id": "x"}) == "update"


def test_wrong_password_is_auth_failed(book: AccountStore, server: Radicale) -> None:
    book.add(
        Account(name="people", kind="carddav", url=server.url + "/", username="alice"), "wrong"
    )
    c = Contacts(None, Services(personal=PersonalRuntime(book, PersonalSettings())))
    assert c.run(ContactsParams(query="sam")).code == "auth-failed"
