"""Durable permission requests: each one stored in the store when raised, until it ends.

The PolicyActor owns the requests (``actors/gate/policy.py``); this is their table.
A request is written when the gate asks, and ends once, with its settlement
(``allow_once``, ``allow_always``, ``deny``, ``expired``, ``withdrawn``) and
who answered it. A daemon that stops or dies leaves its open requests
``pending``: the next start reads them back (:meth:`ApprovalStore.left_open`),
so ``chalie policy pending`` still lists them and any owner client still
answers them, and they still expire to a denial at their ``expires_at``.
The call that waited is stored beside its request (:class:`ResumableCall`: the tool,
its validated arguments, its turn's context), unless its arguments hold a secret (a
redacted field: raw secrets are never stored). Its turn ended ``interrupted`` with the
run that died; when the owner allows it after the restart, the PolicyActor hands the
stored call back to the dispatcher as a background call whose gate is that answer
(``TurnContext.resumes``, :meth:`ApprovalStore.take_resume`), and its result reaches the
conversation as a background result. A call that was not stored, or one the owner
denies, ends with a background result that says so.

Several daemons on one store: each request names the gate that raised it (``raised_by``,
one id a daemon process), and that gate holds a lease of that name
(:meth:`chalie.store.sql.Connection.lease`) while it runs. Another daemon lists a live gate's
requests and answers them (the raising gate hears of it and its call resumes there,
:data:`SETTLED`), but never adopts them as left open; the requests of a gate that is gone
are left open for whichever daemon answers them.

An answer covers exactly the call the owner saw (:func:`call_binding`: the tool, the
permission, the call's validated arguments and its reach, as one digest stored with the
request). A parked request's ``allow_once`` is taken only by a call with the same digest
(:meth:`ApprovalStore.take_grant`), and a resumed call only runs when its digest is the
stored one (:meth:`ApprovalStore.take_resume`): any other call is a new request.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from chalie.store.sql import Store
from chalie.store.store_place import Place
from chalie.wire.events import PermissionRequest
from chalie.wire.messages import TurnContext

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS permission_requests (
    request_id      TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    permission      TEXT NOT NULL,
    body            BLOB NOT NULL,
    created         REAL NOT NULL,
    expires_at      REAL NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    answered_by     TEXT,
    settled_at      REAL,
    -- park_asks: raised for an agent with no human; its call ended at once
    parked          INTEGER NOT NULL DEFAULT 0,
    -- an allow_once of a parked request, taken by the call when the agent asks again
    used            INTEGER NOT NULL DEFAULT 0,
    -- the outcome of a parked request was told to the agent
    delivered       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS permission_requests_open ON permission_requests (state);
"""
# Added after the first release: a store made before has no such columns yet.
_LATER_COLUMNS: Final = {
    "call": "ALTER TABLE permission_requests ADD COLUMN call BLOB",
    # call_binding() of the call the owner was asked about (NULL: a row from before; no
    # call matches it, so an answer to it is never taken by a call)
    "binding": "ALTER TABLE permission_requests ADD COLUMN binding TEXT",
    # the gate (a daemon process, chalie.calls.trail.process_writer) that raised it; NULL: before
    "raised_by": "ALTER TABLE permission_requests ADD COLUMN raised_by TEXT",
}
# A gate's lease, held while it runs: its requests are not left open.
GATE_LEASE: Final = "approvals-gate:"
RESUMABLE: Final = ("allow_once", "allow_always")
# The notice a settled request sends to every daemon on a shared store (chalie.store.sql.follow).
SETTLED: Final = "chalie_approvals"


class ResumableCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call that waits for an answer, as it can be dispatched again after a restart."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    act_summary: str
    context: TurnContext


PENDING: Final = "pending"
# Settled rows kept for the record, newest first; older ones are pruned.
KEEP_SETTLED: Final = 10_000

_encode = msgspec.json.Encoder().encode
_canonical = msgspec.json.Encoder(order="sorted", enc_hook=repr).encode


def call_binding(tool: str, permission: str, params: Mapping[str, Any], reach: str | None) -> str:
    """The digest an answer is bound to: the tool, the permission, the validated arguments
    (every default applied, keys sorted; secrets included, so a call that swaps a secret is
    another call) and the reach text. Only the digest is stored, never the secret."""
    body = _canonical(
        {"tool": tool, "permission": permission, "params": dict(params), "reach": reach}
    )
    return hashlib.sha256(b"chalie-call-binding-v1\0" + body).hexdigest()


_decode = msgspec.json.Decoder(PermissionRequest).decode
_decode_call = msgspec.json.Decoder(ResumableCall).decode


def encode_call(call: ResumableCall) -> bytes | None:
    """The stored form of a call (None: it cannot be stored)."""
    try:
        return _encode(call)
    except (TypeError, ValueError, msgspec.EncodeError):
        return None


def _read(body: bytes) -> PermissionRequest:
    """A stored request. One stored by an earlier version (a wire message then: tagged
    ``kind``, its ``asked_by`` named ``origin``) is read as the request it was."""
    try:
        return _decode(body)
    except msgspec.ValidationError:
        old = msgspec.json.decode(body)
        if not isinstance(old, dict) or old.pop("kind", None) != "permission_request":
            raise
        old["type"] = "permission_request"
        old["asked_by"] = old.pop("origin", "")
        return msgspec.convert(old, PermissionRequest)


class ApprovalStore(Store):
    """The ``permission_requests`` table; one connection, safe from any thread."""

    def __init__(self, path: Place, *, gate: str | None = None) -> None:
        """``gate``: the id of the gate that raises requests through this store (it holds
        that gate's lease); None for a store that only reads and answers."""
        super().__init__(path, _SCHEMA)
        self.gate = gate
        with self._lock:
            self._add_columns("permission_requests", _LATER_COLUMNS)
            if gate is not None:
                self._conn.lease(GATE_LEASE + gate)  # False: another of ours holds it

    def put(
        self,
        request: PermissionRequest,
        *,
        parked: bool = False,
        call: bytes | None = None,
        binding: str | None = None,
    ) -> None:
        """Store a request as it is raised (committed on return), with the call that waits
        for it (``encode_call``), if it can be run again, and the digest of the call it asks
        about (:func:`call_binding`; None: no later call can take its answer)."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO permission_requests (request_id, conversation_id, "
                "permission, body, created, expires_at, state, parked, call, binding, raised_by) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (request_id) DO UPDATE SET "
                "conversation_id = excluded.conversation_id, permission = excluded.permission, "
                "body = excluded.body, created = excluded.created, "
                "expires_at = excluded.expires_at, state = excluded.state, "
                "parked = excluded.parked, call = excluded.call, binding = excluded.binding, "
                "raised_by = excluded.raised_by, "
                "answered_by = NULL, settled_at = NULL, used = 0, delivered = 0",
                (
                    request.request_id,
                    request.conversation_id,
                    request.permission,
                    _encode(request),
                    time.time(),
                    request.expires_at,
                    PENDING,
                    1 if parked else 0,
                    call,
                    binding,
                    self.gate,
                ),
            )

    def waiting_call(self, request_id: str) -> tuple[bool, ResumableCall | None]:
        """Whether the request was parked, and the call stored with it (None: none, or
        unreadable)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT parked, call FROM permission_requests WHERE request_id = ?",
                (request_id,),
            ).fetchone()
        if row is None:
            return False, None
        parked, body = bool(row[0]), row[1]
        if body is None:
            return parked, None
        try:
            return parked, _decode_call(body)
        except msgspec.DecodeError:
            return parked, None

    def take_resume(self, request_id: str, permission: str, binding: str) -> bool:
        """Use the owner's allow of a stored call's request, once: True when it was allowed
        for this very call (its permission and :func:`call_binding`) and not used yet."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE permission_requests SET used = 1 WHERE request_id = ? AND "
                "permission = ? AND binding = ? AND parked = 0 AND used = 0 AND "
                "call IS NOT NULL AND state IN (?, ?)",
                (request_id, permission, binding, *RESUMABLE),
            )
        return cur.rowcount == 1

    def take_grant(self, conversation_id: str, permission: str, binding: str) -> str | None:
        """Use the owner's ``allow_once`` of a parked request for exactly this call (the
        conversation, the permission and :func:`call_binding`); its id, or None. One
        statement: two daemons on one store never both take one answer."""
        with self._lock:
            row = self._conn.execute(
                "UPDATE permission_requests SET used = 1 WHERE used = 0 AND request_id = ("
                "SELECT request_id FROM permission_requests WHERE conversation_id = ? AND "
                "permission = ? AND binding = ? AND parked = 1 AND state = 'allow_once' "
                "AND used = 0 ORDER BY settled_at LIMIT 1) RETURNING request_id",
                (conversation_id, permission, binding),
            ).fetchone()
        return None if row is None else str(row[0])

    def outcomes(self, conversation_id: str) -> list[tuple[str, str, str]]:
        """Parked requests of a conversation the owner has settled and the agent has not
        heard of: (request id, permission, how it ended), marked told, oldest first. One
        statement: with two daemons on one store, each outcome is told once."""
        with self._lock:
            rows = self._conn.execute(
                "UPDATE permission_requests SET delivered = 1 WHERE conversation_id = ? AND "
                "parked = 1 AND state != ? AND delivered = 0 "
                "RETURNING request_id, permission, state, settled_at",
                (conversation_id, PENDING),
            ).fetchall()
        rows.sort(key=lambda r: (r[3] is None, r[3] or 0.0))
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def request(self, request_id: str) -> PermissionRequest | None:
        """The request if it is pending (raised here or by another daemon on the store)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT body FROM permission_requests WHERE request_id = ? AND state = ?",
                (request_id, PENDING),
            ).fetchone()
        if row is None:
            return None
        try:
            return _read(row[0])
        except msgspec.DecodeError:
            return None

    def settle(self, request_id: str, state: str, answered_by: str | None = None) -> bool:
        """End a pending request; False when it was not pending (ended already). Every daemon
        on a shared store hears of it (:data:`SETTLED`, the request id): the one whose call
        waits for it completes the call."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE permission_requests SET state = ?, answered_by = ?, settled_at = ? "
                "WHERE request_id = ? AND state = ?",
                (state, answered_by, time.time(), request_id, PENDING),
            )
            self._conn.execute(
                "DELETE FROM permission_requests WHERE state != ? AND request_id NOT IN "
                "(SELECT request_id FROM permission_requests WHERE state != ? "
                "ORDER BY settled_at DESC LIMIT ?)",
                (PENDING, PENDING, KEEP_SETTLED),
            )
            if cur.rowcount == 1:
                self._conn.notify(SETTLED, request_id)
        return cur.rowcount == 1

    def left_open(self) -> list[PermissionRequest]:
        """Requests still pending that no other live gate holds (a previous run's, at
        start: this gate's own, or a gate's that is gone), oldest first."""
        return [r for r, live in self._open() if not live]

    def still_pending(self) -> list[PermissionRequest]:
        """Every request still pending on the store, whichever gate raised it, oldest first."""
        return [r for r, _live in self._open()]

    def raised_live_elsewhere(self, request_id: str) -> bool:
        """Whether the request was raised by another gate that still runs (its call waits
        there)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT raised_by FROM permission_requests WHERE request_id = ?", (request_id,)
            ).fetchone()
            return self._live_elsewhere(row[0] if row else None)

    def _live_elsewhere(self, gate: str | None) -> bool:
        # under self._lock
        return gate is not None and gate != self.gate and self._conn.leased(GATE_LEASE + gate)

    def _open(self) -> list[tuple[PermissionRequest, bool]]:
        """Pending requests, oldest first, each with whether another live gate raised it."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT body, raised_by FROM permission_requests WHERE state = ? ORDER BY created",
                (PENDING,),
            ).fetchall()
            live = {gate: self._live_elsewhere(gate) for gate in {r[1] for r in rows}}
        found = []
        for body, gate in rows:
            try:
                found.append((_read(body), live[gate]))
            except msgspec.DecodeError:
                continue  # unreadable: it can be neither shown nor answered
        return found

    def state(self, request_id: str) -> tuple[str, str | None] | None:
        """(state, answered_by) of a request, or None when unknown."""
        with self._lock:
            row = self._conn.execute(
                "SELECT state, answered_by FROM permission_requests WHERE request_id = ?",
                (request_id,),
            ).fetchone()
        return None if row is None else (str(row[0]), row[1])
