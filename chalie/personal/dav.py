"""A small WebDAV client for CalDAV (RFC 4791) and CardDAV (RFC 6352), on :mod:`.http`.

What the abilities need and no more: find the account's collections (the URL
itself, or current-user-principal → the home set → its children), query a
calendar by time range, read every card of an address book (PROPFIND for the
ETags, then one multiget), read, write and delete one resource with its ETag
(``If-Match`` / ``If-None-Match: *``). A resource id the model hands back is
only accepted inside one of the account's own collections.

XML comes from the user's own server; it is parsed with the standard library,
whose expat refuses entity-expansion bombs, and bounded by the HTTP client.
"""

from __future__ import annotations

import posixpath
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar

from chalie.accounts.failure import AccountFailure
from chalie.personal.http import HttpClient

DAV: Final = "DAV:"
CALDAV: Final = "urn:ietf:params:xml:ns:caldav"
CARDDAV: Final = "urn:ietf:params:xml:ns:carddav"
CS: Final = "http://calendarserver.org/ns/"
Kind = Literal["calendar", "addressbook"]
_NS_DECL: Final = f'xmlns:D="{DAV}" xmlns:C="{CALDAV}" xmlns:A="{CARDDAV}" xmlns:CS="{CS}"'
_XML: Final = {"Content-Type": "application/xml; charset=utf-8"}


T = TypeVar("T")


def keep_unchanged(
    etags: Mapping[str, str], old: Mapping[str, tuple[str, T]], kept: dict[str, tuple[str, T]]
) -> list[str]:
    """Copy into ``kept`` each resource of ``old`` whose ETag is still ``etags``'s; the hrefs
    of the others (new, changed, or without an ETag), to fetch again."""
    wanted = []
    for href, etag in etags.items():
        prev = old.get(href)
        if prev is not None and etag and prev[0] == etag:
            kept[href] = prev
        else:
            wanted.append(href)
    return wanted


def _q(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


@dataclass(frozen=True)
class Collection:
    href: str  # absolute path on the server, ending in /
    name: str
    ctag: str = ""
    components: tuple[str, ...] = ()
    sync_token: str = ""


@dataclass
class Resource:
    href: str
    etag: str = ""
    data: str = ""
    props: dict[str, ET.Element] = field(default_factory=dict)
    status: str = ""  # the response's own status line, when it has one (sync: 404 = gone)


@dataclass
class Changes:
    """What a sync-collection REPORT answered: the new token, what changed, what went."""

    token: str
    found: list[Resource]
    gone: list[str]


MAX_SYNC_ROUNDS: Final = 20


def _text(el: ET.Element | None) -> str:
    # An Element with no children is falsy: never write `el or default` for one.
    return (el.text or "").strip() if el is not None else ""


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class DavClient:
    """One account's WebDAV server; every failure an AccountFailure naming the account."""

    def __init__(self, who: str, url: str, http: HttpClient) -> None:
        self.who = who
        self.url = url if url.endswith("/") else url + "/"
        parts = urllib.parse.urlsplit(self.url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.http = http

    # -- plumbing ---------------------------------------------------------------------
    def absolute(self, href: str) -> str:
        return urllib.parse.urljoin(self.origin + "/", href)

    def _multistatus(self, content: bytes, top: dict[str, str] | None = None) -> list[Resource]:
        try:
            root = ET.fromstring(content)
        except ET.ParseError:
            raise AccountFailure(
                "account-bad-response", "the server's XML does not parse", account=self.who
            ) from None
        if top is not None:
            top["sync-token"] = _text(root.find(_q(DAV, "sync-token")))
        out: list[Resource] = []
        for resp in root.iter(_q(DAV, "response")):
            href_el = resp.find(_q(DAV, "href"))
            if href_el is None or not href_el.text:
                continue
            href = urllib.parse.urlsplit(href_el.text.strip()).path
            res = Resource(
                href=urllib.parse.unquote(href), status=_text(resp.find(_q(DAV, "status")))
            )
            for ps in resp.iter(_q(DAV, "propstat")):
                status = ps.findtext(_q(DAV, "status")) or ""
                if " 200 " not in status + " ":
                    continue
                prop = ps.find(_q(DAV, "prop"))
                for child in prop if prop is not None else ():
                    res.props[child.tag] = child
            res.etag = _text(res.props.get(_q(DAV, "getetag")))
            for tag in (_q(CALDAV, "calendar-data"), _q(CARDDAV, "address-data")):
                el = res.props.get(tag)
                if el is not None and el.text:
                    res.data = el.text
            out.append(res)
        return out

    def propfind(self, url: str, props: str, depth: int) -> list[Resource]:
        body = (
            f'<?xml version="1.0" encoding="utf-8"?><D:propfind {_NS_DECL}>'
            f"<D:prop>{props}</D:prop></D:propfind>"
        )
        resp = self.http.request(
            "PROPFIND", url, body=body.encode(), headers={**_XML, "Depth": str(depth)}, ok=(207,)
        )
        return self._multistatus(resp.content)

    def report(self, url: str, body: str, depth: int = 1) -> list[Resource]:
        resp = self.http.request(
            "REPORT",
            url,
            body=f'<?xml version="1.0" encoding="utf-8"?>{body}'.encode(),
            headers={**_XML, "Depth": str(depth)},
            ok=(207,),
        )
        return self._multistatus(resp.content)

    @staticmethod
    def _href_of(res: Resource, tag: str) -> str | None:
        el = res.props.get(tag)
        if el is None:
            return None
        found = el.findtext(_q(DAV, "href"))
        return found.strip() if found else None

    # -- discovery ----------------------------------------------------------------------
    _PROPS: Final = (
        "<D:resourcetype/><D:displayname/><D:current-user-principal/><CS:getctag/>"
        "<D:sync-token/><C:calendar-home-set/><A:addressbook-home-set/>"
        "<C:supported-calendar-component-set/>"
    )

    @staticmethod
    def _marker(kind: Kind) -> str:
        return _q(CALDAV, "calendar") if kind == "calendar" else _q(CARDDAV, "addressbook")

    def listing(self, kind: Kind) -> tuple[str, int]:
        """Where the account's collections of ``kind`` are listed: (URL, PROPFIND depth).

        The account's URL itself when it is such a collection (depth 0), else the
        home set found through current-user-principal (depth 1).
        """
        home_tag = (
            _q(CALDAV, "calendar-home-set")
            if kind == "calendar"
            else _q(CARDDAV, "addressbook-home-set")
        )
        first = self.propfind(self.url, self._PROPS, 0)
        if first and self._is(first[0], self._marker(kind)):
            return self.url, 0
        home = self._href_of(first[0], home_tag) if first else None
        if home is None and first:
            principal = self._href_of(first[0], _q(DAV, "current-user-principal"))
            if principal:
                found = self.propfind(self.absolute(principal), self._PROPS, 0)
                home = self._href_of(found[0], home_tag) if found else None
        return (self.absolute(home) if home else self.url), 1

    def listed(self, kind: Kind, url: str, depth: int) -> list[Collection]:
        """The collections of ``kind`` at a :meth:`listing`, with their CTags (one PROPFIND)."""
        out = [
            self._collection(r)
            for r in self.propfind(url, self._PROPS, depth)
            if self._is(r, self._marker(kind))
            and (
                kind != "calendar"
                or not r.props.get(_q(CALDAV, "supported-calendar-component-set"))
                or "VEVENT" in self._components(r)
            )
        ]
        return sorted(out, key=lambda c: c.href)

    def collections(self, kind: Kind) -> list[Collection]:
        """The account's calendars (holding events) or address books."""
        return self.listed(kind, *self.listing(kind))

    @staticmethod
    def _is(res: Resource, marker: str) -> bool:
        rt = res.props.get(_q(DAV, "resourcetype"))
        return rt is not None and rt.find(marker) is not None

    @staticmethod
    def _components(res: Resource) -> tuple[str, ...]:
        el = res.props.get(_q(CALDAV, "supported-calendar-component-set"))
        if el is None:
            return ()
        return tuple(c.get("name", "") for c in el.iter(_q(CALDAV, "comp")))

    def _collection(self, res: Resource) -> Collection:
        href = res.href if res.href.endswith("/") else res.href + "/"
        name = _text(res.props.get(_q(DAV, "displayname")))
        tag = res.props.get(_q(CS, "getctag"))
        sync = res.props.get(_q(DAV, "sync-token"))
        ctag = (tag.text if tag is not None else None) or (sync.text if sync is not None else "")
        return Collection(
            href=href,
            name=name or posixpath.basename(href.rstrip("/")),
            ctag=ctag or "",
            components=self._components(res),
            sync_token=(sync.text if sync is not None else "") or "",
        )

    def ctag(self, collection: Collection) -> str:
        found = self.propfind(self.absolute(collection.href), "<CS:getctag/><D:sync-token/>", 0)
        if not found:
            return ""
        tag = found[0].props.get(_q(CS, "getctag"))
        sync = found[0].props.get(_q(DAV, "sync-token"))
        return (
            (tag.text if tag is not None else None) or (sync.text if sync is not None else "") or ""
        )

    # -- reading -----------------------------------------------------------------------
    def events_between(self, collection: Collection, start: str, end: str) -> list[Resource]:
        """Events (with their data) that overlap [start, end), times as UTC ``YYYYMMDDTHHMMSSZ``."""
        body = (
            f"<C:calendar-query {_NS_DECL}><D:prop><D:getetag/><C:calendar-data/></D:prop>"
            '<C:filter><C:comp-filter name="VCALENDAR"><C:comp-filter name="VEVENT">'
            f'<C:time-range start="{start}" end="{end}"/></C:comp-filter></C:comp-filter>'
            "</C:filter></C:calendar-query>"
        )
        return [r for r in self.report(self.absolute(collection.href), body) if r.data]

    def etags(self, collection: Collection) -> dict[str, str]:
        """Every member resource of a collection: href -> ETag (one PROPFIND, Depth 1)."""
        found = self.propfind(self.absolute(collection.href), "<D:getetag/><D:resourcetype/>", 1)
        return {r.href: r.etag for r in found if r.href.rstrip("/") != collection.href.rstrip("/")}

    def multiget(self, collection: Collection, hrefs: list[str], kind: Kind) -> list[Resource]:
        """The named resources with their data, in one REPORT."""
        if not hrefs:
            return []
        listed = "".join(f"<D:href>{_escape(urllib.parse.quote(h))}</D:href>" for h in hrefs)
        if kind == "calendar":
            tag, data = "C:calendar-multiget", "<C:calendar-data/>"
        else:
            tag, data = "A:addressbook-multiget", "<A:address-data/>"
        body = f"<{tag} {_NS_DECL}><D:prop><D:getetag/>{data}</D:prop>{listed}</{tag}>"
        return [r for r in self.report(self.absolute(collection.href), body) if r.data]

    def sync(self, collection: Collection, token: str, kind: Kind) -> Changes | None:
        """RFC 6578 sync-collection: what changed since ``token`` ("" = everything), with data.

        None when the server will not answer one (no support, or a token it no longer
        knows: RFC 6578 3.2); the caller then compares ETags instead. Members the
        answer names without their data are fetched by one multiget.
        """
        data = "<C:calendar-data/>" if kind == "calendar" else "<A:address-data/>"
        url = self.absolute(collection.href)
        found: dict[str, Resource] = {}
        gone: set[str] = set()
        for _ in range(MAX_SYNC_ROUNDS):
            body = (
                f'<?xml version="1.0" encoding="utf-8"?><D:sync-collection {_NS_DECL}>'
                f"<D:sync-token>{_escape(token)}</D:sync-token><D:sync-level>1</D:sync-level>"
                f"<D:prop><D:getetag/>{data}</D:prop></D:sync-collection>"
            )
            resp = self.http.request(
                "REPORT",
                url,
                body=body.encode(),
                headers={**_XML, "Depth": "1"},
                ok=(207, 400, 403, 404, 405, 409, 412, 415, 501),
            )
            if resp.status != 207:
                return None
            top: dict[str, str] = {}
            listed = self._multistatus(resp.content, top)
            if not top.get("sync-token"):
                return None
            truncated = False
            for r in listed:
                if r.href.rstrip("/") == collection.href.rstrip("/"):
                    truncated = truncated or " 507" in f" {r.status}"
                    continue
                inside = (
                    r.href.startswith(collection.href) and "/" not in r.href[len(collection.href) :]
                )
                if not inside:  # a member is directly inside the collection, nothing else
                    continue
                if " 404" in f" {r.status}":
                    gone.add(r.href)
                    found.pop(r.href, None)
                else:
                    gone.discard(r.href)
                    found[r.href] = r
            token = top["sync-token"]
            if not truncated:
                break
        else:
            return None
        missing = [h for h, r in found.items() if not r.data]
        if missing:
            for r in self.multiget(collection, missing, kind):
                found[r.href] = r
        return Changes(token, [r for r in found.values() if r.data], sorted(gone))

    def get(self, href: str) -> Resource:
        resp = self.http.request("GET", self.absolute(href), ok=(200,))
        return Resource(href=href, etag=resp.headers.get("etag", ""), data=resp.text)

    # -- writing -----------------------------------------------------------------------
    def put(self, href: str, data: str, content_type: str, *, etag: str | None) -> str:
        """Create (``etag=None``: If-None-Match *) or replace (If-Match) one resource; its ETag."""
        headers = {"Content-Type": f"{content_type}; charset=utf-8"}
        if etag is None:
            headers["If-None-Match"] = "*"
        elif etag:
            headers["If-Match"] = etag
        resp = self.http.request(
            "PUT", self.absolute(href), body=data.encode(), headers=headers, ok=(200, 201, 204)
        )
        return resp.headers.get("etag", "")

    def delete(self, href: str, *, etag: str = "") -> None:
        headers = {"If-Match": etag} if etag else {}
        self.http.request("DELETE", self.absolute(href), headers=headers, ok=(200, 204))


def check_href(href: str, collections: list[Collection], who: str) -> str:
    """The id (a resource path) if it lies directly inside one of ``collections``."""
    clean = posixpath.normpath("/" + href.strip().lstrip("/")) if href.strip() else ""
    for c in collections:
        if (
            clean.startswith(c.href)
            and "/" not in clean[len(c.href) :]
            and clean != c.href.rstrip("/")
        ):
            return clean
    raise AccountFailure(
        "item-not-found",
        f"{href[:120]!r} is not an item of this account",
        account=who,
        param="id",
    )
