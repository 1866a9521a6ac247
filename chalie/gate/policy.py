"""The permission policy: the (channel, permission) table, resolution, gate decisions, the store.

The table maps ``(channel, permission)`` to ``allow | ask | deny | internal``.
A permission is a tool name (``calendar``) or a tool name qualified by the
action its ability derived from the inputs (``calendar.delete_event``).

Resolution (one rule, :func:`resolve`): the exact ``tool.action`` entry an
operator set; else the operator's entry for the bare ``tool``; else ``ask``.
The tool-level fallback lets an operator allow or deny a whole tool with one
entry while still overriding one risky action. Permissions the gate met but
nobody configured are recorded with origin ``seen`` (setting ``ask``) so the
operator finds them in ``policy list``; a ``seen`` row never shadows a
tool-level entry, because it states no choice.

Turning a setting into a decision (:func:`decide`): ``allow`` runs,
``internal`` runs without showing on the policy surface, ``deny`` refuses,
and ``ask`` asks the conversation's human, which only a channel in
:data:`HUMAN_CHANNELS` with a human present can do: ``chat``, and
``external_agent`` on the one turn an inbound agent asked to loop a connected
human in (``[mcp_server] loop_in_human_asks``; the inbound MCP server is the
only place that sets ``human_present`` there). Everywhere else ``ask`` is a
deny whose hint says a human must approve.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, get_args

import msgspec

from chalie.gate.display import NAME_CHARS, one_line, param_lines, reach_line
from chalie.gate.forms import BadAnswer, check_answer
from chalie.store.sql import follow, open_connection
from chalie.store.store_place import Place
from chalie.wire.mcp_names import SERVER_WILDCARD, server_of, server_wildcard
from chalie.wire.messages import (
    ANSWERS,
    CHANNELS,
    DECISIONS,
    Channel,
    DecidedBy,
    Decision,
    GateDecision,
)
from chalie.wire.principals import Principal

# A tool name (MCP proxies start with "_"), optionally ".action".
PERMISSION: Final = re.compile(r"^_?[a-z][a-z0-9_]{0,127}(?:\.[a-z0-9_][a-z0-9_-]{0,63})?$")
# A whole MCP server's tools at once: ``_mcp_<server>_*`` (server slugs have no "_").
ACTION: Final = re.compile(r"^[a-z0-9_][a-z0-9_-]{0,63}$")

Origin = Literal["set", "seen"]
Verdict = Literal["allow", "deny", "ask-human"]
# The channels where a present human may be asked; subconscious never asks.
HUMAN_CHANNELS: Final = ("chat", "external_agent")
Table = Mapping[tuple[str, str], Decision]


class PolicyError(ValueError):
    """A bad channel, permission, decision or answer (the message names it), or an answer
    from a principal that may not give it (``code`` ``forbidden``)."""

    def __init__(self, message: str, *, code: str = "invalid-arguments") -> None:
        super().__init__(message)
        self.code = code


class PolicyRow(msgspec.Struct, frozen=True, kw_only=True):
    channel: str
    permission: str
    decision: str
    updated_at: float
    origin: str = "set"


# -- validation -------------------------------------------------------------


def check_channel(channel: object) -> Channel:
    if channel not in CHANNELS:
        raise PolicyError(f"unknown channel {channel!r}; channels are {', '.join(CHANNELS)}")
    return channel  # type: ignore[return-value]


def check_permission(permission: object) -> str:
    if isinstance(permission, str) and SERVER_WILDCARD.match(permission):
        return permission
    if not isinstance(permission, str) or not PERMISSION.match(permission):
        raise PolicyError(
            f"invalid permission {str(permission)[:80]!r}; expected tool or tool.action "
            "(lowercase letters, digits, underscores)"
        )
    return permission


def check_decision(decision: object) -> Decision:
    if decision not in DECISIONS:
        raise PolicyError(f"unknown decision {decision!r}; decisions are {', '.join(DECISIONS)}")
    return decision  # type: ignore[return-value]


def permission_for(tool: str, action: str | None) -> str:
    """``tool`` or ``tool.action``. Raises PolicyError for an action that is not a plain word."""
    if action is None or action == "":
        return tool
    if not isinstance(action, str) or not ACTION.match(action):
        raise PolicyError(f"classify() returned an unusable action {str(action)[:80]!r}")
    return f"{tool}.{action}"


# -- resolution ---------------------------------------------------------------


def resolve(
    table: Table, channel: str, permission: str, *, sensitive: bool = False
) -> Decision | None:
    """The operator's setting for the call: exact entry, else the tool's, else (for a remote
    MCP proxy ``_mcp_<server>_...``) the server's ``_mcp_<server>_*``, else None (unset).

    A ``sensitive`` call (its ability declared a reach, :meth:`chalie.ability.Ability.reach`)
    is allowed only by its exact entry: a broader ``allow`` or ``internal`` never covers it
    (a broader ``deny`` still denies it).
    """
    hit = table.get((channel, permission))
    if hit is not None:
        return hit
    tool, dot, _ = permission.partition(".")
    if dot:
        hit = table.get((channel, tool))
        if hit is not None:
            return _narrowed(hit, sensitive)
    server = server_of(tool)
    if server is not None:
        return _narrowed(table.get((channel, server_wildcard(server))), sensitive)
    return None


def asked_by(principal: Principal | None, channel: str) -> str:
    """Who asked, through which channel: one line for a prompt (never a secret)."""
    who = "the owner" if principal is None else principal.shown()
    return f"{who}, on the {channel} channel"


def prompt(
    tool: str,
    permission: str,
    act_summary: str,
    params: Mapping[str, Any],
    asked_by: str,
    reach: str | None,
    *,
    notes: Sequence[str] = (),
    form: bool = False,
) -> str:
    """The text a person reads before answering: what, what it reaches beyond Chalie,
    who asked, the parameters the call gave, and (unless it is a form to fill) what each
    answer covers.

    Every model-written part is escaped to one line and capped
    (:mod:`chalie.gate.display`), so a parameter cannot forge a line of its own.
    """
    lines = [f"Allow {one_line(permission, NAME_CHARS)}?"]
    if reach is not None:  # first: what leaves Chalie is what the person must weigh
        lines.append(reach_line(reach))
    lines += [
        f"Asked by: {one_line(asked_by)}",
        f"Says it will: {one_line(act_summary) or '(no summary)'}",
    ]
    lines.extend(f"Note: {one_line(note)}" for note in notes)
    lines.append("Parameters:")
    lines.extend(f"  {line}" for line in param_lines(dict(params)) or ["(none)"])
    if not form:
        lines.append(
            "once allows this call only, exactly as above; always allows "
            f"{one_line(permission, NAME_CHARS)} from now on, whatever its parameters"
        )
    del tool
    return "\n".join(lines)


def _narrowed(hit: Decision | None, sensitive: bool) -> Decision | None:
    if sensitive and hit in ("allow", "internal"):
        return None  # unset for this call: the gate asks
    return hit


def decide(setting: Decision | None, *, channel: str, human_present: bool) -> Verdict:
    """What the gate does with a setting; ``None`` (never configured) is ``ask``."""
    if setting in ("allow", "internal"):
        return "allow"
    if setting == "deny":
        return "deny"
    if human_present and channel in HUMAN_CHANNELS:
        return "ask-human"
    return "deny"


def gate_rule(
    setting: Decision | None,
    *,
    permission: str,
    channel: str,
    human_present: bool,
    internal: bool,
) -> GateDecision | None:
    """The one gate rule: the decision for a call, or None when a human must be asked.

    Both the PolicyActor and the dispatcher's fast path call this; neither
    restates it. ``internal`` abilities run without a setting; otherwise the
    operator's setting (``None``: never configured, so ``ask``) is turned into
    a verdict by :func:`decide`.
    """
    if internal:
        return allowed("internal")
    verdict = decide(setting, channel=channel, human_present=human_present)
    if verdict == "allow":
        return allowed("internal" if setting == "internal" else "policy")
    if verdict == "deny":
        if setting == "deny":
            return denied_by_policy(permission, channel)
        return denied_without_human(permission, channel)
    return None


# -- the decisions the gate hands back -----------------------------------------


def allowed(by: DecidedBy) -> GateDecision:
    return GateDecision(decision="allow", decided_by=by)


def denied_by_policy(permission: str, channel: str) -> GateDecision:
    return GateDecision(
        decision="deny",
        decided_by="policy",
        code="permission-denied",
        message=f"The policy denies {permission} on the {channel} channel.",
        hint="do not retry this call; tell the user it is blocked by policy.",
    )


def denied_without_human(permission: str, channel: str) -> GateDecision:
    return GateDecision(
        decision="deny",
        decided_by="policy",
        code="permission-denied",
        message=f"{permission} needs a human's approval, and none can answer on the "
        f"{channel} channel.",
        hint="do not retry this call; a human must approve this action: ask the user to "
        "allow it in the policy, or do without it.",
    )


def parked(permission: str, request_id: str) -> GateDecision:
    """park_asks: the call ends now; the owner answers the stored request later."""
    return GateDecision(
        decision="deny",
        decided_by="policy",
        code="approval-pending",
        message=f"{permission} waits for the owner's approval (request {request_id}).",
        hint="tell the caller it waits for the owner; once the owner has answered, the same "
        "call in this conversation runs (if allowed) without asking again.",
    )


def denied_by_human(permission: str) -> GateDecision:
    return GateDecision(
        decision="deny",
        decided_by="human",
        code="permission-denied",
        message=f"The user declined {permission}.",
        hint="do not retry this call; ask the user what they want instead.",
    )


def approval_expired(permission: str, after: float) -> GateDecision:
    return GateDecision(
        decision="deny",
        decided_by="policy",
        code="approval-expired",
        message=f"Nobody answered the request to allow {permission} within {after:g} s.",
        hint="ask the user whether to try again before repeating the call.",
    )


def failed_closed(reason: str) -> GateDecision:
    return GateDecision(
        decision="deny",
        decided_by="fail-closed",
        code="permission-denied",
        message=f"The permission gate failed ({reason[:200]}), so the call is refused.",
        hint="this is a fault in the runtime, not in your call; try again later.",
    )


def answer_decision(
    answer: str,
    permission: str,
    form: Mapping[str, Any] | None = None,
    content: Any = None,
) -> GateDecision:
    """The decision a person's answer makes. A request with a form (``form``) is answered
    ``allow_once`` (or ``allow_always``, the same: a form is never filled for the owner)
    with ``content``, the fields, checked against the form, or ``deny`` (decline);
    anything else is a PolicyError and the request stays pending."""
    if answer not in ANSWERS:
        raise PolicyError(f"unknown answer {answer!r}; answers are {', '.join(ANSWERS)}")
    if form is None and content is not None:
        raise PolicyError("only a request with a form is answered with content")
    if answer == "deny":
        return denied_by_human(permission)
    if form is None:
        return allowed("human")
    if content is None:
        raise PolicyError("this request is a form: answer it with its fields, or deny")
    try:
        checked = check_answer(form, content)
    except BadAnswer as exc:
        raise PolicyError(str(exc)) from None
    return GateDecision(decision="allow", decided_by="human", content=checked)


# -- the store ---------------------------------------------------------------


def _sql_set(values: tuple[str, ...]) -> str:
    """``'a', 'b'``: an SQL list of the literal's values (they are plain identifiers)."""
    assert all(re.fullmatch(r"[a-z_-]+", v) for v in values)
    return ", ".join(f"'{v}'" for v in values)


_SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS policy (
    channel    TEXT NOT NULL,
    permission TEXT NOT NULL,
    decision   TEXT NOT NULL CHECK (decision IN ({_sql_set(DECISIONS)})),
    origin     TEXT NOT NULL CHECK (origin IN ({_sql_set(get_args(Origin))})),
    updated_at REAL NOT NULL,
    PRIMARY KEY (channel, permission)
)
"""


# The notice a policy change sends to every daemon on a shared store.
CHANGED: Final = "chalie_policy"


class PolicyStore:
    """The table in the store (:mod:`chalie.store.sql`), with an in-memory copy of the operator's
    entries.

    One owner (the PolicyActor) writes; ``table`` is an immutable snapshot
    swapped whole on each change, so other threads may read it without a lock.
    """

    def __init__(self, place: Place) -> None:
        self.place = place
        self._conn = open_connection(place)
        self._lock = threading.Lock()
        self._conn.script(_SCHEMA)
        self.table: Mapping[tuple[str, str], Decision] = {}
        # Another daemon on a shared store changed the table: read it again (chalie.store.sql).
        # Listening first, then reading: no change falls between the two.
        self._follower = follow(place, CHANGED, self._changed)
        self._reload()

    def _changed(self, _payload: str) -> None:
        with self._lock:
            self._reload()

    def close(self) -> None:
        self._follower.close()
        with self._lock:
            self._conn.close()

    def _reload(self) -> None:
        rows = self._conn.execute(
            "SELECT channel, permission, decision FROM policy WHERE origin = 'set'"
        ).fetchall()
        self.table = {(c, p): d for c, p, d in rows}

    def rows(self, *, include_internal: bool = False) -> list[PolicyRow]:
        with self._lock:
            found = self._conn.execute(
                "SELECT channel, permission, decision, updated_at, origin FROM policy "
                "ORDER BY permission, channel"
            ).fetchall()
        return [
            PolicyRow(channel=c, permission=p, decision=d, updated_at=u, origin=o)
            for c, p, d, u, o in found
            if include_internal or d != "internal"
        ]

    def set(self, channel: str, permission: str, decision: str) -> PolicyRow:
        row = PolicyRow(
            channel=check_channel(channel),
            permission=check_permission(permission),
            decision=check_decision(decision),
            updated_at=time.time(),
        )
        with self._lock:
            self._conn.execute(
                "INSERT INTO policy (channel, permission, decision, origin, updated_at) "
                "VALUES (?, ?, ?, 'set', ?) ON CONFLICT (channel, permission) DO UPDATE SET "
                "decision = excluded.decision, origin = 'set', updated_at = excluded.updated_at",
                (row.channel, row.permission, row.decision, row.updated_at),
            )
            self._reload()
            self._conn.notify(CHANGED)
        return row

    def record_seen(self, channel: str, permission: str) -> bool:
        """Note an unconfigured permission as ``ask`` so the operator sees it; True if new."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO policy (channel, permission, decision, origin, updated_at) "
                "VALUES (?, ?, 'ask', 'seen', ?) ON CONFLICT DO NOTHING",
                (check_channel(channel), check_permission(permission), time.time()),
            )
            return cur.rowcount == 1

    def reset(self, channel: str | None = None, permission: str | None = None) -> int:
        """Forget entries (all, one channel's, one permission's, or one pair); returns how many."""
        clauses: list[str] = []
        args: list[str] = []
        if channel is not None:
            clauses.append("channel = ?")
            args.append(check_channel(channel))
        if permission is not None:
            clauses.append("permission = ?")
            args.append(check_permission(permission))
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock:
            try:
                cur = self._conn.execute(f"DELETE FROM policy{where}", args)
            finally:
                self._reload()
            self._conn.notify(CHANGED)
            return cur.rowcount


__all__ = [
    "ANSWERS",
    "DECISIONS",
    "PolicyError",
    "PolicyRow",
    "PolicyStore",
    "allowed",
    "answer_decision",
    "approval_expired",
    "check_channel",
    "check_decision",
    "check_permission",
    "decide",
    "denied_by_human",
    "denied_by_policy",
    "denied_without_human",
    "failed_closed",
    "gate_rule",
    "permission_for",
    "resolve",
]
