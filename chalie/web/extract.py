"""Readable text out of fetched or given bytes: HTML, PDF, plain text, Markdown, JSON.

HTML: the article's text by trafilatura (its ``fast`` mode: the main-content
extraction without the fallback comparisons, about 60 ms for a 1 MB article
page on this machine, against 350 ms with its metadata pass), and the title,
date and links read by lxml directly (trafilatura's metadata pass is what
costs the rest). When trafilatura finds no main content (a page that is all
navigation, or a tiny page) the whole visible text is used, scripts and styles
dropped. PDF: pypdf, page by page, at most :data:`MAX_PDF_PAGES` pages.
Plain text, Markdown and JSON are decoded and kept as they are.

Decoding: the charset the server declared, else a byte-order mark, else (HTML)
the page's own ``<meta charset>``, else UTF-8 if the bytes are UTF-8, else
charset_normalizer's best guess. A type none of these is raises
:class:`ExtractError` with code ``unsupported-content``.
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:  # lxml, trafilatura and pypdf load on the first page read, not at start
    import lxml.html

Kind = Literal["html", "pdf", "text", "markdown", "json"]
MAX_PDF_PAGES: Final = 300
MAX_LINKS: Final = 200
HTML_TYPES: Final = frozenset({"text/html", "application/xhtml+xml"})
TEXT_TYPES: Final = frozenset({"text/plain", "text/csv", "text/x-rst"})
MARKDOWN_TYPES: Final = frozenset({"text/markdown", "text/x-markdown"})
JSON_TYPES: Final = frozenset({"application/json", "application/ld+json", "text/json"})
PDF_TYPES: Final = frozenset({"application/pdf", "application/x-pdf"})
BY_SUFFIX: Final[dict[str, Kind]] = {
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".pdf": "pdf",
    ".txt": "text",
    ".text": "text",
    ".csv": "text",
    ".log": "text",
    ".rst": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".json": "json",
}
_META_CHARSET: Final = re.compile(rb"""<meta[^>]+charset=["']?([A-Za-z0-9_.:-]{1,40})""", re.I)
_BOMS: Final = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_DATE_META: Final = (
    "article:published_time",
    "og:published_time",
    "datepublished",
    "date",
    "dc.date",
    "dcterms.date",
    "pubdate",
)

# trafilatura logs every page it finds no content in at WARNING/ERROR: data, not our fault.
logging.getLogger("trafilatura").setLevel(logging.CRITICAL)


class ExtractError(Exception):
    def __init__(self, message: str, code: str = "unsupported-content") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Link:
    text: str
    url: str


@dataclass(frozen=True)
class Document:
    kind: Kind
    title: str
    text: str
    date: str | None = None
    pages: int | None = None
    links: tuple[Link, ...] = field(default=())


def kind_of(content_type: str, body: bytes, name: str = "") -> Kind | None:
    """What the bytes are: by declared type, else by name, else by sniffing."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in HTML_TYPES:
        return "html"
    if media in PDF_TYPES:
        return "pdf"
    if media in MARKDOWN_TYPES:
        return "markdown"
    if media in JSON_TYPES or media.endswith("+json"):
        return "json"
    if media in TEXT_TYPES:
        return "text"
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    by_name = BY_SUFFIX.get(suffix)
    if by_name is not None:
        return by_name
    head = body[:512].lstrip().lower()
    if body.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "html"
    if media in ("", "application/octet-stream", "binary/octet-stream") or media.startswith(
        "text/"
    ):
        if b"\x00" not in body[:4096] and _decodes(body[:65536]):
            return "text"
    return None


def _decodes(sample: bytes) -> bool:
    try:
        sample.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        return exc.start >= len(sample) - 4  # a character cut at the sample's end


def decode(body: bytes, charset: str | None, *, html: bool = False) -> str:
    """The text of ``body`` (see the module's decoding order); never raises."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body.decode(name, errors="replace")
    names: list[str] = []
    if charset:
        names.append(charset)
    if html:
        found = _META_CHARSET.search(body[:4096])
        if found:
            names.append(found.group(1).decode("ascii"))
    for name in names:
        try:
            codecs.lookup(name)
        except LookupError:
            continue
        return body.decode(name, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(body[:262_144]).best()
    if best is not None:
        return body.decode(best.encoding, errors="replace")
    return body.decode("utf-8", errors="replace")


def extract(
    body: bytes,
    content_type: str = "",
    charset: str | None = None,
    *,
    url: str = "",
    name: str = "",
    structured: bool = False,
) -> Document:
    """The readable document in ``body``; ExtractError when it is not a kind we read.

    ``structured``: keep the structure (HTML as Markdown: headings, lists,
    tables; PDF pages marked), as ``read`` wants it.
    """
    kind = kind_of(content_type, body, name or urlsplit(url).path)
    if kind is None:
        raise ExtractError(
            f"content type {content_type or 'unknown'!r} is not read "
            "(HTML, PDF, plain text, Markdown and JSON are)"
        )
    if kind == "pdf":
        return _pdf(body, structured)
    text = decode(body, charset, html=kind == "html")
    if kind == "html":
        return html_document(text, url, structured=structured)
    if kind == "markdown":
        heading = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), "")
        return Document("markdown", heading, text)
    if kind == "json":
        try:
            json.loads(text)
        except ValueError:
            return Document("text", "", text)
        return Document("json", "", text)
    return Document("text", "", text)


def html_document(text: str, url: str = "", *, structured: bool = False) -> Document:
    """Title, main text (as Markdown when ``structured``), date and links of one HTML page."""
    import lxml.etree
    import lxml.html
    import trafilatura

    if not text.strip():
        return Document("html", "", "")
    try:
        tree = lxml.html.document_fromstring(text)
    except (ValueError, lxml.etree.ParserError) as exc:
        raise ExtractError(f"the HTML does not parse: {exc}") from None
    title, date, links = _title(tree), _date(tree), _links(tree, url)
    # trafilatura prunes the tree it is given: metadata and links are read first.
    main = trafilatura.extract(
        tree,
        url=url or None,
        fast=True,
        include_comments=False,
        with_metadata=False,
        output_format="markdown" if structured else "txt",
    )
    body = (main or "").strip()
    if len(body) < 40:
        body = visible_text(lxml.html.document_fromstring(text))
    return Document("html", title, body, date=date, links=links)


def visible_text(tree: lxml.html.HtmlElement) -> str:
    """The text a reader sees: scripts, styles and templates dropped, blocks on their own lines."""
    for bad in tree.xpath("//script|//style|//noscript|//template|//head"):
        bad.drop_tree()
    lines = (" ".join(t.split()) for t in tree.itertext())
    return "\n".join(line for line in lines if line)


def _title(tree: lxml.html.HtmlElement) -> str:
    for path in ("//meta[@property='og:title']/@content", "//title/text()", "//h1//text()"):
        found = tree.xpath(path)
        if found:
            title = " ".join(str(found[0]).split())
            if title:
                return title[:300]
    return ""


def _date(tree: lxml.html.HtmlElement) -> str | None:
    for meta in tree.xpath("//meta[@content]"):
        key = (meta.get("property") or meta.get("name") or meta.get("itemprop") or "").lower()
        if key in _DATE_META:
            return str(meta.get("content"))[:40]
    found = tree.xpath("//time/@datetime")
    return str(found[0])[:40] if found else None


def _links(tree: lxml.html.HtmlElement, url: str) -> tuple[Link, ...]:
    out: dict[str, Link] = {}
    for anchor in tree.xpath("//a[@href]"):
        href = str(anchor.get("href")).strip()
        if not href or href.startswith(("#", "javascript:", "mailto:", "tel:", "data:")):
            continue
        absolute = urljoin(url, href) if url else href
        if urlsplit(absolute).scheme not in ("http", "https") or absolute in out:
            continue
        out[absolute] = Link(" ".join(anchor.text_content().split())[:200], absolute)
        if len(out) >= MAX_LINKS:
            break
    return tuple(out.values())


def _pdf(body: bytes, structured: bool = False) -> Document:
    import pypdf
    from pypdf.errors import LimitReachedError, PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(body))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractError("the PDF is encrypted")
        pages = reader.pages
        texts = []
        for number, page in enumerate(pages):
            if number >= MAX_PDF_PAGES:
                texts.append(f"[... {len(pages) - MAX_PDF_PAGES} more pages not read]")
                break
            text = (page.extract_text() or "").strip()
            texts.append(f"--- page {number + 1} ---\n{text}" if structured else text)
        meta = reader.metadata
        title = str(meta.title or "") if meta is not None else ""
    except ExtractError:
        raise
    except LimitReachedError as exc:  # a stream that inflates past the reader's limit
        raise ExtractError(
            f"the PDF is past its reader's limits: {type(exc).__name__}: {exc}"[:300],
            "fetch-too-large",
        ) from None
    except (PyPdfError, ValueError, KeyError, TypeError, OSError, RecursionError) as exc:
        raise ExtractError(f"the PDF does not parse: {type(exc).__name__}: {exc}"[:300]) from None
    return Document("pdf", title.strip(), "\n\n".join(t for t in texts if t), pages=len(pages))
