"""A tool's rich payload as MCP content blocks, for an agent that called Chalie over MCP.

The payload is the one ``ToolResult.rich`` carries (``{"items": [...]}``, the
shape :func:`chalie.mcp.results.content_parts` makes for a remote tool's
images, audio, embedded resources and resource links). Each item that is well
formed becomes its block (``ImageContent``, ``AudioContent``,
``EmbeddedResource``, ``ResourceLink``); anything else is skipped, never
guessed. A turn's blocks are bounded in count and bytes: a result that would
pass the bound is cut, and the cut is said in one text block.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any, Final

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from pydantic import ValidationError

MAX_BLOCKS: Final = 32
MAX_BYTES: Final = 16 * 1024 * 1024  # base64 characters across a result's blocks
MAX_TEXT: Final = 256 * 1024
MAX_MIME: Final = 128


def _b64(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return value


def _mime(value: Any, default: str) -> str:
    if isinstance(value, str) and 0 < len(value) <= MAX_MIME and "/" in value:
        return value
    return default


def block(item: Mapping[str, Any]) -> ContentBlock | None:
    """One payload item as its content block; None for one that is not well formed."""
    kind = item.get("type")
    mime = item.get("mime_type") or item.get("mimeType")
    try:
        if kind in ("image", "audio"):
            data = _b64(item.get("data"))
            if data is None:
                return None
            if kind == "image":
                return ImageContent(type="image", data=data, mime_type=_mime(mime, "image/png"))
            return AudioContent(type="audio", data=data, mime_type=_mime(mime, "audio/wav"))
        uri = item.get("uri")
        if not isinstance(uri, str) or not uri:
            return None
        if kind == "resource_link":
            name = item.get("name")
            return ResourceLink(
                type="resource_link",
                uri=uri,
                name=name if isinstance(name, str) and name else uri,
                mime_type=_mime(mime, "") or None,
            )
        if kind == "resource":
            blob = _b64(item.get("blob"))
            contents: TextResourceContents | BlobResourceContents
            if blob is not None:
                contents = BlobResourceContents(
                    uri=uri, blob=blob, mime_type=_mime(mime, "application/octet-stream")
                )
            else:
                text = item.get("text")
                if not isinstance(text, str):
                    return None
                contents = TextResourceContents(
                    uri=uri, text=text[:MAX_TEXT], mime_type=_mime(mime, "text/plain")
                )
            return EmbeddedResource(type="resource", resource=contents)
    except ValidationError:
        return None
    return None


def _weight(found: ContentBlock) -> int:
    if isinstance(found, ImageContent | AudioContent):
        return len(found.data)
    if isinstance(found, EmbeddedResource):
        res = found.resource
        return len(res.blob) if isinstance(res, BlobResourceContents) else len(res.text)
    return 0


def blocks(payloads: Iterable[Any]) -> list[ContentBlock]:
    """Every rich payload of a turn (in order) as content blocks, bounded."""
    out: list[ContentBlock] = []
    budget, cut = MAX_BYTES, 0
    for payload in payloads:
        items = payload.get("items") if isinstance(payload, Mapping) else None
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, Mapping):
                continue
            found = block(item)
            if found is None:
                continue
            weight = _weight(found)
            if len(out) >= MAX_BLOCKS or weight > budget:
                cut += 1
                continue
            budget -= weight
            out.append(found)
    if cut:
        out.append(
            TextContent(type="text", text=f"({cut} more rich items were too many or too large.)")
        )
    return out
