"""What the web abilities hand the model: documents as untrusted results, failures as errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import chalie.calls.untrusted as untrusted
from chalie.result import Scalar, ToolResult
from chalie.services import Services

if TYPE_CHECKING:
    from chalie.web.extract import Document
    from chalie.web.kit import WebKit

LINKS_SHOWN: Final = 40


def kit_of(services: Services | None) -> WebKit | ToolResult:
    from chalie.web.kit import WebKit

    kit = services.web if services is not None else None
    if isinstance(kit, WebKit):
        return kit
    return ToolResult.error(
        "fetch-failed",
        "the web tools are not set up in this process",
        hint="This tool runs inside the daemon only.",
    )


def error(code: str, message: str, hint: str = "") -> ToolResult:
    return ToolResult.error(code, message or code, hint=hint)


def cut(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit].rstrip() + f"\n[... cut: {len(text) - limit} more characters]", True


def document_result(
    doc: Document,
    url: str,
    limit: int,
    *,
    links: bool = False,
    extra_meta: dict[str, Scalar] | None = None,
    rich: dict[str, Any] | None = None,
) -> ToolResult:
    """The document as an untrusted body: title and URL lines, the text, maybe its links."""
    text, truncated = cut(doc.text, limit)
    lines = [f"Title: {doc.title or '(none)'}", f"URL: {url}"]
    if doc.date:
        lines.append(f"Date: {doc.date}")
    if doc.pages is not None:
        lines.append(f"Pages: {doc.pages}")
    lines += ["", text or "(no readable text)"]
    if links and doc.links:
        lines += ["", "Links:"]
        lines += [f"- {link.text or '(no text)'}: {link.url}" for link in doc.links[:LINKS_SHOWN]]
    meta: dict[str, Scalar] = {
        "url": url[:2048],
        "kind": doc.kind,
        "chars": len(doc.text),
        "truncated": truncated,
        **(extra_meta or {}),
    }
    source = {"title": doc.title, "url": url, "kind": doc.kind, "text": text}
    return untrusted.success("\n".join(lines), meta=meta, rich=rich or {"source": source})
