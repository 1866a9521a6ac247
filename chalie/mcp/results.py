"""Mapping a remote call's outcome onto the result contract; never a failure dressed as success.

- text content → the body; ``structuredContent`` → a JSON body;
- images, audio, embedded resources and resource links → the rich payload,
  each with a one-line mention in the body for the model;
- ``isError`` → ``mcp-tool-error``, the remote message in the error and its
  first line as the hint;
- a lost or absent connection → ``mcp-unreachable`` naming the server;
- HTTP 401/403 → ``mcp-auth-failed`` naming the server;
- the server's own timeout (-32001) or ours → ``tool-timeout``;
- an unknown tool → ``mcp-unknown-tool``; a quarantined one →
  ``mcp-tool-quarantined`` naming what changed.

Every result carries ``mcp_server`` and ``mcp_tool`` in its meta (provenance).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

from chalie.mcp.tools import clean_text
from chalie.result import ToolResult
from chalie.wire.mcp_names import RESOURCES, extra_name

MAX_BODY: Final = 256 * 1024
MAX_RICH_BYTES: Final = 16 * 1024 * 1024
TIMEOUT_CODE: Final = -32001
# Our own JSON-RPC error code: an answer refused for its size (chalie.mcp.stdio sends it).
TOO_LARGE: Final = -32099
# How the SDK's Streamable HTTP transport says an answer was past its size limit (an SSE
# event; a JSON body refused by chalie.mcp.session.BoundedTransport).
SSE_TOO_LARGE: Final = "byte limit"
JSON_TOO_LARGE: Final = "bytes; refused"
PARSE_ERROR: Final = -32700
CONNECTION_CLOSED: Final = -32000
MAX_DEPTH: Final = 64  # structured content walked this deep for media payloads
MIN_PAYLOAD: Final = 16  # a shorter "payload" could equal an ordinary string: left alone


def _meta(server: str, tool: str) -> dict[str, str]:
    return {"mcp_server": server, "mcp_tool": tool[:200]}


def _size(data: Any) -> int:
    if not isinstance(data, str):
        return 0
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def _cap(text: str) -> str:
    if len(text) <= MAX_BODY:
        return text
    return text[:MAX_BODY] + f"\n… (truncated: {len(text) - MAX_BODY} more characters)"


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def content_parts(content: Any) -> tuple[list[str], list[dict[str, Any]], dict[str, str]]:
    """(text lines for the body, rich items, each media payload -> its mention) from a
    result's content blocks."""
    texts: list[str] = []
    rich: list[dict[str, Any]] = []
    mentions: dict[str, str] = {}
    budget = MAX_RICH_BYTES
    for item in content or ():
        kind = _field(item, "type")
        if kind == "text":
            text = _field(item, "text")
            if isinstance(text, str):
                texts.append(text)
        elif kind in ("image", "audio"):
            data, mime = _field(item, "data"), _field(item, "mime_type") or _field(item, "mimeType")
            size = _size(data)
            label = f"({kind} {clean_text(str(mime), 60)}, {size} bytes, shown to the user)"
            if isinstance(data, str) and len(data) <= budget:
                budget -= len(data)
                rich.append({"type": kind, "mime_type": str(mime), "data": data})
            else:
                label = f"({kind} {clean_text(str(mime), 60)}, {size} bytes, too large to pass on)"
            texts.append(label)
            if isinstance(data, str) and len(data) >= MIN_PAYLOAD:
                mentions[data] = label
        elif kind == "resource":
            res = _field(item, "resource")
            uri = clean_text(str(_field(res, "uri")), 300)
            text = _field(res, "text")
            if isinstance(text, str):
                texts.append(text)
            blob = _field(res, "blob")
            mime = _field(res, "mime_type") or _field(res, "mimeType") or ""
            entry: dict[str, Any] = {"type": "resource", "uri": uri, "mime_type": str(mime)}
            if isinstance(blob, str) and len(blob) <= budget:
                budget -= len(blob)
                entry["blob"] = blob
                texts.append(f"(resource {uri}, {_size(blob)} bytes, shown to the user)")
                if len(blob) >= MIN_PAYLOAD:
                    mentions[blob] = texts[-1]
            elif isinstance(text, str):
                entry["text"] = text[:MAX_BODY]
            rich.append(entry)
        elif kind == "resource_link":
            uri = clean_text(str(_field(item, "uri")), 300)
            name = clean_text(str(_field(item, "name") or ""), 120)
            rich.append({"type": "resource_link", "uri": uri, "name": name})
            texts.append(f"(link {name}: {uri})" if name else f"(link {uri})")
    return texts, rich, mentions


def call_result(server: str, tool: str, result: Any) -> ToolResult:
    """A CallToolResult (SDK object or dict) as a ToolResult."""
    meta: dict[str, Any] = _meta(server, tool)
    is_error = bool(_field(result, "is_error") or _field(result, "isError"))
    texts, rich, mentions = content_parts(_field(result, "content"))
    if any(item.get("type") == "resource_link" for item in rich):
        # in the tag, so a structured body says it too: the proxy that reads the links
        meta["read_links_with"] = extra_name(server, RESOURCES)
    if is_error:
        message = "\n".join(texts).strip() or "no message"
        first = clean_text(message.splitlines()[0] if message else "", 180)
        return ToolResult.error(
            "mcp-tool-error",
            _cap(f"The remote tool {tool[:120]} on MCP server {server} failed: {message}"),
            hint=f"the server said: {first}" if first else "the server gave no reason.",
            meta=meta,
        )
    structured = _field(result, "structured_content")
    if structured is None:
        structured = _field(result, "structuredContent")
    payload = {"items": rich} if rich else None
    if isinstance(structured, dict | list):
        if mentions:  # media the content already carries: the model reads its mention
            structured = _mention_media(structured, mentions, 0)
        try:
            body = ToolResult.success(structured, rich=payload, meta=meta)
        except TypeError:
            body = None
        if body is not None and len(body.body) <= MAX_BODY:
            return body
    return ToolResult.success(_cap("\n".join(texts)), rich=payload, meta=meta)


def _mention_media(value: Any, mentions: dict[str, str], depth: int) -> Any:
    """A copy of structured content where every string that is a media payload of the
    content blocks (a server that returns content blocks as its structured result repeats
    them) is that payload's mention: base64 never reaches the model's context."""
    if isinstance(value, str):
        return mentions.get(value, value)
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _mention_media(v, mentions, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_mention_media(v, mentions, depth + 1) for v in value]
    return value


def unreachable(server: str, tool: str, why: str) -> ToolResult:
    return ToolResult.error(
        "mcp-unreachable",
        f"The MCP server {server} is not reachable ({clean_text(why, 200)}).",
        hint=f"the server {server} is offline or lost the connection; try again later or do "
        "without it.",
        meta=_meta(server, tool),
    )


def auth_failed(server: str, tool: str, status: int, *, login: bool = False) -> ToolResult:
    """Refused credentials; ``login``: an OAuth grant expired or revoked (log in again)."""
    if login:
        return ToolResult.error(
            "mcp-auth-failed",
            f"The MCP server {server} needs the owner to log in again (its OAuth grant "
            "expired or was revoked).",
            hint=f"the owner must run chalie mcp login {server}; do not retry until then.",
            meta=_meta(server, tool),
        )
    return ToolResult.error(
        "mcp-auth-failed",
        f"The MCP server {server} refused our credentials (HTTP {status}).",
        hint=f"the operator must fix the credentials of {server} (chalie mcp show {server}); "
        "do not retry.",
        meta=_meta(server, tool),
    )


def unknown_tool(server: str, tool: str, why: str = "") -> ToolResult:
    return ToolResult.error(
        "mcp-unknown-tool",
        f"No enabled MCP server offers {tool[:120]} any more"
        + (f" ({clean_text(why, 160)})." if why else "."),
        hint="call find_tools again to find a tool that does this now.",
        meta=_meta(server, tool),
    )


def quarantined(server: str, tool: str, changed: str) -> ToolResult:
    return ToolResult.error(
        "mcp-tool-quarantined",
        f"The definition of {tool[:120]} on MCP server {server} changed "
        f"({changed or 'definition'}) "
        "since it was approved; it is quarantined.",
        hint=f"the operator must review and approve it (chalie mcp approve {server} {tool[:80]}); "
        "do not retry.",
        meta=_meta(server, tool),
    )


def timed_out(server: str, tool: str, seconds: float | None) -> ToolResult:
    within = f"within {seconds:g} s" if seconds else "in time (the server timed it out)"
    return ToolResult.error(
        "tool-timeout",
        f"{tool[:120]} on MCP server {server} did not answer {within}.",
        hint="try a smaller request, or do without this tool.",
        meta=_meta(server, tool),
    )


def remote_error(server: str, tool: str, code: int, message: str) -> ToolResult:
    """A JSON-RPC error the server answered the call with."""
    if code == TIMEOUT_CODE:
        return timed_out(server, tool, None).with_meta(remote_code=code)
    if (code == CONNECTION_CLOSED and SSE_TOO_LARGE in message) or (
        code == PARSE_ERROR and JSON_TOO_LARGE in message
    ):
        code = TOO_LARGE  # the HTTP transport refused an answer past max_result_bytes
    if code == CONNECTION_CLOSED:
        return unreachable(server, tool, message or "connection closed")
    if code == TOO_LARGE:
        return ToolResult.error(
            "mcp-result-too-large",
            f"The answer of {tool[:120]} on MCP server {server} was too large and was refused "
            f"({clean_text(message, 120)}).",
            hint="ask for less (a smaller page, a narrower query), or do without this tool.",
            meta={**_meta(server, tool), "remote_code": code},
        )
    text = clean_text(message, 500)
    if "unknown tool" in text.lower() or "tool not found" in text.lower():
        return unknown_tool(server, tool, text)
    return ToolResult.error(
        "mcp-tool-error",
        f"The remote tool {tool[:120]} on MCP server {server} failed: {text or 'no message'} "
        f"(error {code}).",
        hint=f"the server said: {text[:180]}" if text else "the server gave no reason.",
        meta={**_meta(server, tool), "remote_code": code},
    )
