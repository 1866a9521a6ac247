"""Remote tool definitions: cleaning, pinning (definition hashes) and the re-sync diff.

:func:`plan` is the whole re-sync rule, pure. Given what the store holds for
one server and the server's current (complete, paginated) tool list:

- a tool seen for the first time is pinned (its definition hash recorded)
  and becomes ``active``;
- an ``active`` tool whose hash still equals its pin stays as it is;
- a tool whose definition differs from its pin becomes ``quarantined``: not
  discoverable, calls refused, its policy back to ``ask``, until the operator
  approves the new definition (:func:`approve`); ``changed`` names what
  changed (description, input schema, name);
- a quarantined tool that reverts to its pinned definition is ``active`` again;
- a tool the server no longer lists becomes ``gone`` (its name is kept, so
  the same remote tool gets the same proxy name if it returns);
- a tool whose schema we cannot use is ``incompatible`` (never callable); its
  pin stays the last approved definition, so a definition change from any
  state (``incompatible`` and ``gone`` included) is quarantined: only the
  pinned definition comes back ``active`` without the operator. The row keeps
  the pinned definition (the broken listing is its ``pending``), so a later
  change is named and diffed against what the operator approved.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from chalie.wire.mcp_names import proxy_name
from chalie.wire.tool_names import FRAMEWORK_FIELDS

State = Literal["active", "quarantined", "gone", "incompatible"]
MAX_DESCRIPTION: Final = 1024
MAX_SCHEMA_BYTES: Final = 64 * 1024
MAX_REMOTE_NAME: Final = 512
# What one remote tool may cost to hold (its row is kept in memory and in chalie.db): a
# longer description is cut before hashing and storing (a digest of the whole stands for
# the rest, so a change past the cut is still a change); a schema past MAX_SCHEMA_BYTES is
# never a proxy's parameters, and only its digest and size are kept.
MAX_REMOTE_DESCRIPTION: Final = 8 * 1024
OVERSIZED: Final = "x-chalie-oversized"
_CONTROL: Final = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]"
)
_SPACE: Final = re.compile(r"\s+")
# Anything that looks like an envelope tag ([name(...)] or [end:name]) loses its bracket.
_TAG: Final = re.compile(r"\[(?=\s*(?:end\s*:|_?[A-Za-z][A-Za-z0-9_]*\s*\())")


class RemoteTool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as the server lists it (name, description, inputSchema)."""

    name: str
    description: str = ""
    schema: dict[str, Any] = {}


class ToolRow(msgspec.Struct, frozen=True, kw_only=True):
    """One remote tool as the store holds it (the cache discovery and descriptors read)."""

    server: str
    remote: str
    proxy: str
    description: str
    schema: dict[str, Any]
    pin: str
    state: State = "active"
    changed: str = ""
    pending: RemoteTool | None = None
    first_seen: float = 0.0
    updated_at: float = 0.0
    problem: str = ""


def clean_text(text: object, limit: int = MAX_DESCRIPTION) -> str:
    """One line of plain text: control and format characters gone, envelope tags defused, capped."""
    if not isinstance(text, str):
        return ""
    text = unicodedata.normalize("NFKC", text[: limit * 4])
    text = _CONTROL.sub(" ", text)
    text = _SPACE.sub(" ", text).strip()
    text = _TAG.sub("(", text)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def definition_hash(tool: RemoteTool) -> str:
    """sha256 over the name, the description and the canonical JSON of the schema."""
    doc = json.dumps(
        [tool.name, tool.description, tool.schema],
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(doc.encode("utf-8", "surrogatepass")).hexdigest()


def what_changed(old: RemoteTool, new: RemoteTool) -> str:
    parts = [
        label
        for label, a, b in (
            ("name", old.name, new.name),
            ("description", old.description, new.description),
            ("input schema", old.schema, new.schema),
        )
        if a != b
    ]
    return ", ".join(parts) or "definition"


def schema_problem(schema: Any) -> str | None:
    """Why an inputSchema cannot be a proxy's parameters, or None."""
    if not isinstance(schema, dict):
        return "its input schema is not an object"
    if OVERSIZED in schema:
        if schema[OVERSIZED] == "not JSON":
            return "its input schema is not JSON"
        return f"its input schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB"
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError):
        return "its input schema is not JSON"
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB"
    if schema.get("type", "object") != "object":
        return "its input schema is not of type object"
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        return "its input schema's properties is not an object"
    clash = [f for f in FRAMEWORK_FIELDS if f in props]
    if clash:
        return f"it declares parameters the framework reserves ({', '.join(clash)})"
    import jsonschema  # here: `chalie mcp list` and the store need no schema checker

    try:
        jsonschema.Draft202012Validator.check_schema({**schema, "type": "object"})
    except jsonschema.SchemaError as exc:
        return f"its input schema is invalid ({exc.message[:100]})"
    except Exception as exc:  # hostile schemas can break the meta-validator itself
        return f"its input schema could not be checked ({type(exc).__name__})"
    return None


def proxy_parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The remote schema as a proxy's parameters (always ``type: object``, no title)."""
    out = {k: v for k, v in schema.items() if k not in ("title", "$id")}
    out["type"] = "object"
    out.setdefault("properties", {})
    return out


def remote_tool(raw: Any) -> RemoteTool | None:
    """A listed tool (an SDK ``Tool`` or a dict) as a RemoteTool; None without a usable name."""
    name = getattr(raw, "name", None) if not isinstance(raw, dict) else raw.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_REMOTE_NAME:
        return None
    if isinstance(raw, dict):
        description, schema = raw.get("description"), raw.get("inputSchema")
    else:
        description, schema = getattr(raw, "description", None), getattr(raw, "input_schema", None)
    return RemoteTool(
        name=name,
        description=bounded_description(description) if isinstance(description, str) else "",
        schema=bounded_schema(schema) if isinstance(schema, dict) else {},
    )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def bounded_description(text: str) -> str:
    """``text``, or its first MAX_REMOTE_DESCRIPTION characters and a digest of the whole."""
    if len(text) <= MAX_REMOTE_DESCRIPTION:
        return text
    return f"{text[: MAX_REMOTE_DESCRIPTION - 80]} [cut; sha256:{_digest(text)}]"


def bounded_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, or (past MAX_SCHEMA_BYTES of JSON) a stand-in holding its digest and size."""
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError, RecursionError):
        return {OVERSIZED: "not JSON", "bytes": 0}
    if len(text) <= MAX_SCHEMA_BYTES:
        return schema
    return {OVERSIZED: _digest(text), "bytes": len(text)}


@dataclass
class SyncPlan:
    """The difference one re-sync applies: rows to write and proxies to (un)register."""

    rows: list[ToolRow] = field(default_factory=list)  # every row whose content changed
    added: list[str] = field(default_factory=list)  # proxies that became callable
    removed: list[str] = field(default_factory=list)  # proxies that stopped being callable
    quarantined: list[str] = field(default_factory=list)  # newly quarantined (policy → ask)
    skipped: list[str] = field(default_factory=list)  # listed entries with no usable name

    @property
    def empty(self) -> bool:
        return not (self.rows or self.added or self.removed)


def _as_remote(row: ToolRow) -> RemoteTool:
    return RemoteTool(name=row.remote, description=row.description, schema=row.schema)


def plan(
    server: str,
    held: Sequence[ToolRow],
    listed: Iterable[Any],
    taken: Mapping[str, str],
    *,
    now: float | None = None,
) -> SyncPlan:
    """The re-sync of one server (see the module doc). ``taken``: proxy → ``server/remote``."""
    now = time.time() if now is None else now
    out = SyncPlan()
    by_remote = {r.remote: r for r in held}
    names = dict(taken)
    seen: set[str] = set()
    for raw in listed:
        tool = remote_tool(raw)
        if tool is None:
            out.skipped.append(str(getattr(raw, "name", raw))[:60])
            continue
        if tool.name in seen:
            continue  # a server listing one name twice: the first wins
        seen.add(tool.name)
        digest = definition_hash(tool)
        problem = schema_problem(tool.schema)
        row = by_remote.get(tool.name)
        if row is None:
            proxy = proxy_name(server, tool.name, names)
            names[proxy] = f"{server}/{tool.name}"
            new = ToolRow(
                server=server,
                remote=tool.name,
                proxy=proxy,
                description=tool.description,
                schema=tool.schema,
                pin=digest,
                state="incompatible" if problem else "active",
                first_seen=now,
                updated_at=now,
                problem=problem or "",
            )
            out.rows.append(new)
            if not problem:
                out.added.append(proxy)
            continue
        callable_before = row.state == "active"
        if problem and digest != row.pin:
            # Broken now: never callable. The row keeps the pinned (last approved)
            # definition, which a later change is diffed and named against, and holds
            # the broken listing as pending (shown; never approvable: not quarantined).
            new = msgspec.structs.replace(
                row, state="incompatible", changed="", pending=tool, problem=problem
            )
            if new != row:
                new = msgspec.structs.replace(new, updated_at=now)
        elif problem or digest == row.pin:
            # The pinned definition itself: active again (or broken as first seen).
            new = msgspec.structs.replace(
                row,
                description=tool.description,
                schema=tool.schema,
                state="incompatible" if problem else "active",
                changed="",
                pending=None,
                problem=problem or "",
            )
            if new != row:
                new = msgspec.structs.replace(new, updated_at=now)
        else:
            # Any change of definition, from any state (active, incompatible, gone,
            # quarantined), waits for the operator's approval.
            pending = row.pending
            if (
                pending is not None
                and definition_hash(pending) == digest
                and row.state == "quarantined"
            ):
                continue  # the same change we already hold in quarantine
            new = msgspec.structs.replace(
                row,
                state="quarantined",
                changed=what_changed(_as_remote(row), tool),
                pending=tool,
                problem="",
                updated_at=now,
            )
            if row.state != "quarantined":
                out.quarantined.append(row.proxy)
        if new != row:
            out.rows.append(new)
        callable_now = new.state == "active"
        if callable_now and (
            not callable_before or new.schema != row.schema or new.description != row.description
        ):
            out.added.append(new.proxy)
        elif callable_before and not callable_now:
            out.removed.append(new.proxy)
    for row in held:
        if row.remote not in seen and row.state != "gone":
            out.rows.append(msgspec.structs.replace(row, state="gone", updated_at=now))
            if row.state == "active":
                out.removed.append(row.proxy)
    return out


def approve(row: ToolRow, *, now: float | None = None) -> ToolRow:
    """A quarantined row with its pending definition accepted and pinned."""
    if row.state != "quarantined" or row.pending is None:
        return row
    tool = row.pending
    return msgspec.structs.replace(
        row,
        description=tool.description,
        schema=tool.schema,
        pin=definition_hash(tool),
        state="active",
        changed="",
        pending=None,
        updated_at=time.time() if now is None else now,
    )
