"""Conversations in the store: their messages, their turns and their numbered event log.

Every change a turn makes is one :class:`Batch` written in one transaction
(messages, events, the turn's row), so a SIGKILL leaves either all of a step
or none of it. History invariants a provider relies on are restored by
:meth:`ConversationStore.recover`: a tool call with no result gets an
``interrupted`` result, and the turn that was running ends ``interrupted``.

One connection, serialised by a lock: every TurnActor of the daemon shares
it (SQLite takes one writer at a time anyway; WAL lets readers in). The tables live in
the store (:mod:`chalie.store.sql`): the SQLite file, or a PostgreSQL database several daemons
share. A conversation's owner is kept as its JSON and, for the queries that select by it,
as two plain columns (``principal_id``, ``principal_scope``: no JSON functions, which the
two engines spell differently); queued turns keep their order in ``n``.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from chalie.calls.dispatch import envelope_name
from chalie.calls.envelope import render
from chalie.providers.types import ChatMessage
from chalie.result import ToolResult
from chalie.store.sql import IntegrityError, Store, Writes
from chalie.store.store_place import Place
from chalie.wire.events import (
    ConversationEvent,
    ErrorEvent,
    Event,
    TurnFinished,
    decode_event,
    encode_event,
)
from chalie.wire.principals import Principal

TurnState = Literal["queued", "running", "done"]
MAX_EVENTS_PAGE: Final = 1000
INTERRUPTED_LINE: Final = (
    "The turn was interrupted (the runtime stopped or restarted); "
    "send your message again to continue."
)
# A turn whose actor failed (a fault in Chalie): the line its conversation shows.
FAILED_LINE: Final = (
    "The turn was interrupted by a fault inside Chalie (the daemon's log has the "
    "details); send your message again to continue."
)

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    origin TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    principal TEXT NOT NULL DEFAULT '',
    principal_id TEXT NOT NULL DEFAULT '',
    principal_scope TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS conversation_messages (
    conversation_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    turn_id TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (conversation_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS conversation_events (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS conversation_turns (
    turn_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    client_msg_id TEXT NOT NULL,
    text TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    created REAL NOT NULL,
    finished REAL,
    steps INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0,
    notes TEXT NOT NULL DEFAULT '[]',
    n INTEGER NOT NULL DEFAULT 0,
    UNIQUE (conversation_id, client_msg_id)
);
CREATE INDEX IF NOT EXISTS conversation_turns_state ON conversation_turns (state);
"""

# Columns added after the first release. A conversation made before principals belongs to
# the owner (only the owner sees it); principal_id and principal_scope are filled from the
# principal's JSON as the store opens (_fill_principals).
_LATER_COLUMNS: Final = {
    "conversations": {
        "principal": "ALTER TABLE conversations ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        "principal_id": (
            "ALTER TABLE conversations ADD COLUMN principal_id TEXT NOT NULL DEFAULT ''"
        ),
        "principal_scope": (
            "ALTER TABLE conversations ADD COLUMN principal_scope TEXT NOT NULL DEFAULT ''"
        ),
    },
    "conversation_turns": {
        "n": "ALTER TABLE conversation_turns ADD COLUMN n INTEGER NOT NULL DEFAULT 0",
    },
}
_principal_decoder: Final = msgspec.json.Decoder(Principal)

_msg_encoder: Final = msgspec.json.Encoder()
_msg_decoder: Final = msgspec.json.Decoder(ChatMessage)


@dataclass
class TurnUpdate:
    """A change to one turn's row, written with the batch."""

    turn_id: str
    state: TurnState | None = None
    reason: str | None = None
    steps: int | None = None
    tokens: int | None = None
    notes: list[str] | None = None


@dataclass
class Batch:
    """What one step of a turn writes, all or nothing."""

    conversation_id: str
    messages: list[tuple[int, str, ChatMessage]] = field(default_factory=list)
    events: list[ConversationEvent] = field(default_factory=list)
    turn: TurnUpdate | None = None


class ConversationSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A conversation as listed (the REST API's conversation row derives from this)."""

    id: str
    channel: str
    origin: str
    created: float
    updated: float
    title: str
    messages: int
    last_seq: int


class ConversationInfo(ConversationSummary, frozen=True, kw_only=True):
    # Who the conversation belongs to; None: the owner (made before principals, or locally).
    principal: Principal | None = None


class TurnRow(msgspec.Struct, frozen=True, kw_only=True):
    turn_id: str
    conversation_id: str
    client_msg_id: str
    text: str
    state: str
    reason: str | None
    created: float
    finished: float | None
    steps: int
    tokens: int
    notes: list[str]


@dataclass
class Loaded:
    """A conversation as its actor starts from it."""

    info: ConversationInfo
    messages: list[ChatMessage]
    queued: list[TurnRow]


def interrupted_envelope(tool: str) -> str:
    return render(
        envelope_name(tool),
        ToolResult.error(
            "interrupted",
            "The runtime stopped before this call finished.",
            hint="It may or may not have run; check its effect before calling it again.",
        ),
    )


# On PostgreSQL, the connections the conversation store uses at once (every TurnActor
# writes its steps through it; with one, the turns of all conversations waited in line for
# each other's round trips). SQLite keeps its one connection (one writer a file).
POOL: Final = 4


class ConversationStore(Store):
    """The conversation tables of the store, safe from any thread."""

    def __init__(self, place: Place) -> None:
        super().__init__(place, _SCHEMA, pool=POOL)
        with self._lock:
            for table, later in _LATER_COLUMNS.items():
                self._add_columns(table, later)
            self._fill_principals()

    def _fill_principals(self) -> None:
        """principal_id and principal_scope of rows whose owner JSON has not been read into
        them yet (rows from before those columns); idempotent, any process."""
        rows = self._conn.execute(
            "SELECT id, principal FROM conversations WHERE principal != '' AND principal_scope = ''"
        ).fetchall()
        for conversation_id, raw in rows:
            owner = _principal(raw)
            scope = "owner" if owner is None else owner.scope  # unreadable: the owner's
            self._conn.execute(
                "UPDATE conversations SET principal_id = ?, principal_scope = ? WHERE id = ?",
                ("" if owner is None else owner.id, scope, conversation_id),
            )

    # -- conversations ------------------------------------------------------------------
    def create(
        self,
        conversation_id: str,
        channel: str,
        origin: str = "",
        title: str = "",
        principal: Principal | None = None,
    ) -> None:
        now = time.time()
        owner = "" if principal is None else msgspec.json.encode(principal).decode()
        who, scope = ("", "") if principal is None else (principal.id, principal.scope)
        with self._transaction() as c:
            c.execute(
                "INSERT INTO conversations (id, channel, origin, created, updated, title, "
                "principal, principal_id, principal_scope) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, channel, origin, now, now, title[:200], owner, who, scope),
            )

    def usage(self, principal_id: str) -> tuple[int, int]:
        """(conversations, bytes) one principal keeps: the bytes of their messages, events
        and turn texts (what a quota counts, chalie.conversation.quota)."""
        mine = "SELECT id FROM conversations WHERE principal != '' AND principal_id = ?"
        with self._connection() as c:
            row = c.execute(
                f"SELECT (SELECT COUNT(*) FROM ({mine}) AS mine), "
                "(SELECT COALESCE(SUM(length(body)), 0) FROM conversation_messages "
                f"WHERE conversation_id IN ({mine})) + "
                "(SELECT COALESCE(SUM(length(body)), 0) FROM conversation_events "
                f"WHERE conversation_id IN ({mine})) + "
                "(SELECT COALESCE(SUM(length(text)), 0) FROM conversation_turns "
                f"WHERE conversation_id IN ({mine}))",
                (principal_id,) * 4,
            ).fetchone()
        return int(row[0]), int(row[1])

    def agents_idle_since(self, before: float, limit: int = 1000) -> builtins.list[str]:
        """Conversations of agent tokens (any principal but an owner) with no message
        since ``before``, oldest first (what a retention setting prunes)."""
        with self._connection() as c:
            rows = c.execute(
                "SELECT id FROM conversations WHERE updated < ? AND principal != '' "
                "AND principal_scope != 'owner' ORDER BY updated LIMIT ?",
                (before, limit),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def channel_of(self, conversation_id: str) -> str | None:
        """The conversation's channel, or None when it does not exist (a cheap lookup)."""
        found = self.placement(conversation_id)
        return None if found is None else found[0]

    def placement(self, conversation_id: str) -> tuple[str, str] | None:
        """The conversation's channel and its owning principal's id ('' for the owner)."""
        with self._connection() as c:
            row = c.execute(
                "SELECT channel, principal FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
        if row is None:
            return None
        owner = _principal(row[1])
        return str(row[0]), "" if owner is None or owner.is_owner else owner.id

    def info(self, conversation_id: str) -> ConversationInfo | None:
        with self._connection() as c:
            row = c.execute(
                "SELECT id, channel, origin, created, updated, title, "
                "(SELECT COUNT(*) FROM conversation_messages m WHERE m.conversation_id = c.id), "
                "(SELECT COALESCE(MAX(seq), 0) FROM conversation_events e "
                " WHERE e.conversation_id = c.id), principal "
                "FROM conversations c WHERE id = ?",
                (conversation_id,),
            ).fetchone()
        return _info(row) if row else None

    def list(self, limit: int = 100) -> builtins.list[ConversationInfo]:
        with self._connection() as c:
            rows = c.execute(
                "SELECT id, channel, origin, created, updated, title, "
                "(SELECT COUNT(*) FROM conversation_messages m WHERE m.conversation_id = c.id), "
                "(SELECT COALESCE(MAX(seq), 0) FROM conversation_events e "
                " WHERE e.conversation_id = c.id), principal "
                "FROM conversations c ORDER BY updated DESC LIMIT ?",
                (max(1, min(limit, 10_000)),),
            ).fetchall()
        return [_info(r) for r in rows]

    def delete(self, conversation_id: str) -> bool:
        with self._transaction() as c:
            gone = c.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount
            for table in ("conversation_messages", "conversation_events", "conversation_turns"):
                c.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))
        return bool(gone)

    def load(self, conversation_id: str) -> Loaded | None:
        info = self.info(conversation_id)
        if info is None:
            return None
        with self._connection() as c:
            bodies = c.execute(
                "SELECT body FROM conversation_messages WHERE conversation_id = ? ORDER BY idx",
                (conversation_id,),
            ).fetchall()
            queued = c.execute(
                f"SELECT {_TURN_COLUMNS} FROM conversation_turns "
                "WHERE conversation_id = ? AND state = 'queued' ORDER BY created, n",
                (conversation_id,),
            ).fetchall()
        return Loaded(
            info=info,
            messages=[_msg_decoder.decode(b) for (b,) in bodies],
            queued=[_turn(r) for r in queued],
        )

    # -- turns --------------------------------------------------------------------------
    def queue_turn(
        self, conversation_id: str, turn_id: str, client_msg_id: str, text: str
    ) -> TurnRow | None:
        """Record an accepted message; returns the existing turn when the client id was seen.

        Two round trips on PostgreSQL: the look-up, then the turn and the conversation's
        time written together, all or nothing (:meth:`Connection.pipelined`). A client id
        recorded in between (the same message sent twice at once) is refused by the unique
        index, and answered with the turn that took it."""
        seen = self._turn_of(conversation_id, client_msg_id)
        if seen is not None:
            return seen
        try:
            with self._pipelined() as c:
                c.execute(
                    "INSERT INTO conversation_turns "
                    "(turn_id, conversation_id, client_msg_id, text, state, created, n) "
                    "VALUES (?, ?, ?, ?, 'queued', ?, (SELECT COALESCE(MAX(n), 0) + 1 FROM "
                    "conversation_turns WHERE conversation_id = ?))",
                    (turn_id, conversation_id, client_msg_id, text, time.time(), conversation_id),
                )
                c.execute(
                    "UPDATE conversations SET updated = ? WHERE id = ?",
                    (time.time(), conversation_id),
                )
        except IntegrityError:
            seen = self._turn_of(conversation_id, client_msg_id)
            if seen is None:
                raise
            return seen
        return None

    def _turn_of(self, conversation_id: str, client_msg_id: str) -> TurnRow | None:
        with self._connection() as c:
            row = c.execute(
                f"SELECT {_TURN_COLUMNS} FROM conversation_turns "
                "WHERE conversation_id = ? AND client_msg_id = ?",
                (conversation_id, client_msg_id),
            ).fetchone()
        return _turn(row) if row is not None else None

    def turn(self, turn_id: str) -> TurnRow | None:
        with self._connection() as c:
            row = c.execute(
                f"SELECT {_TURN_COLUMNS} FROM conversation_turns WHERE turn_id = ?", (turn_id,)
            ).fetchone()
        return _turn(row) if row else None

    def turns(self, conversation_id: str) -> builtins.list[TurnRow]:
        with self._connection() as c:
            rows = c.execute(
                f"SELECT {_TURN_COLUMNS} FROM conversation_turns WHERE conversation_id = ? "
                "ORDER BY created, n",
                (conversation_id,),
            ).fetchall()
        return [_turn(r) for r in rows]

    # -- the step write -----------------------------------------------------------------
    def write(self, batch: Batch) -> None:
        with self._pipelined() as c:
            self._write(c, batch)

    def _write(self, c: Writes, batch: Batch) -> None:
        cid = batch.conversation_id
        if batch.messages:
            c.executemany(
                "INSERT INTO conversation_messages (conversation_id, idx, turn_id, body) "
                "VALUES (?, ?, ?, ?)",
                [(cid, idx, turn_id, _msg_encoder.encode(m)) for idx, turn_id, m in batch.messages],
            )
        if batch.events:
            c.executemany(
                "INSERT INTO conversation_events (conversation_id, seq, body) VALUES (?, ?, ?)",
                [(cid, e.seq, encode_event(e)) for e in batch.events],
            )
        t = batch.turn
        if t is not None:
            sets: list[str] = []
            values: list[Any] = []
            if t.state is not None:
                sets.append("state = ?")
                values.append(t.state)
                if t.state == "done":
                    sets.append("finished = ?")
                    values.append(time.time())
            for column, value in (("reason", t.reason), ("steps", t.steps), ("tokens", t.tokens)):
                if value is not None:
                    sets.append(f"{column} = ?")
                    values.append(value)
            if t.notes is not None:
                sets.append("notes = ?")
                values.append(json.dumps(t.notes))
            if sets:
                c.execute(
                    f"UPDATE conversation_turns SET {', '.join(sets)} WHERE turn_id = ?",
                    (*values, t.turn_id),
                )
        if batch.messages or (t is not None and t.state is not None):
            c.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), cid))

    # -- events -------------------------------------------------------------------------
    def events(
        self, conversation_id: str, after_seq: int = 0, limit: int = 200
    ) -> builtins.list[Event]:
        limit = max(1, min(int(limit), MAX_EVENTS_PAGE))
        with self._connection() as c:
            rows = c.execute(
                "SELECT body FROM conversation_events WHERE conversation_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (conversation_id, max(0, int(after_seq)), limit),
            ).fetchall()
        return [decode_event(b) for (b,) in rows]

    def last_seq(self, conversation_id: str) -> int:
        with self._connection() as c:
            row = c.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM conversation_events WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
        return int(row[0])

    # -- recovery -------------------------------------------------------------------------
    def interrupted_conversations(self) -> builtins.list[str]:
        """Conversations with a turn left running (the daemon or its actor died mid-turn)."""
        with self._connection() as c:
            rows = c.execute(
                "SELECT DISTINCT conversation_id FROM conversation_turns WHERE state = 'running'"
            ).fetchall()
        return [r[0] for r in rows]

    def recover(
        self,
        conversation_id: str,
        *,
        line: str = INTERRUPTED_LINE,
        error: tuple[str, str] | None = None,
    ) -> builtins.list[Event]:
        """Close what a crash left open, in one transaction; returns the events it wrote.

        Every tool call without a result gets an ``interrupted`` result, and
        every turn left ``running`` ends ``interrupted`` with ``line`` for the user,
        after an ``error`` event (code, message) when one is given.
        """
        written: builtins.list[Event] = []
        with self._connection() as c:
            left_running = c.execute(
                "SELECT 1 FROM conversation_turns WHERE conversation_id = ? AND state = 'running' "
                "LIMIT 1",
                (conversation_id,),
            ).fetchone()
        if left_running is None:
            # A turn closes its calls in the same write that ends it: nothing is open.
            return written
        with self._transaction() as c:
            running = c.execute(
                "SELECT turn_id FROM conversation_turns "
                "WHERE conversation_id = ? AND state = 'running' ORDER BY created, n",
                (conversation_id,),
            ).fetchall()
            bodies = c.execute(
                "SELECT idx, turn_id, body FROM conversation_messages "
                "WHERE conversation_id = ? ORDER BY idx",
                (conversation_id,),
            ).fetchall()
            messages = [(idx, turn_id, _msg_decoder.decode(b)) for idx, turn_id, b in bodies]
            repairs = unanswered_calls(messages)
            next_idx = (messages[-1][0] + 1) if messages else 0
            seq_row = c.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM conversation_events WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
            seq = int(seq_row[0])
            batch = Batch(conversation_id)
            for turn_id, call_id, tool in repairs:
                batch.messages.append(
                    (
                        next_idx,
                        turn_id,
                        ChatMessage(
                            role="tool", call_id=call_id, tool=tool, text=interrupted_envelope(tool)
                        ),
                    )
                )
                next_idx += 1
            for (turn_id,) in running:
                ended: builtins.list[Event] = []
                if error is not None:
                    seq += 1
                    ended.append(
                        ErrorEvent(
                            conversation_id=conversation_id,
                            seq=seq,
                            ts=time.time(),
                            turn_id=turn_id,
                            code=error[0],
                            message=error[1],
                        )
                    )
                seq += 1
                ended.append(
                    TurnFinished(
                        conversation_id=conversation_id,
                        seq=seq,
                        ts=time.time(),
                        turn_id=turn_id,
                        reason="interrupted",
                        text=line,
                    )
                )
                batch.events.extend(ended)
                written.extend(ended)
                c.execute(
                    "UPDATE conversation_turns SET state = 'done', reason = 'interrupted', "
                    "finished = ? WHERE turn_id = ?",
                    (time.time(), turn_id),
                )
            self._write(c, batch)
        return written


def unanswered_calls(
    messages: Iterable[tuple[int, str, ChatMessage]],
) -> list[tuple[str, str, str]]:
    """(turn_id, call_id, tool) of every assistant tool call no tool message answers."""
    asked: dict[str, tuple[str, str]] = {}
    order: list[str] = []
    for _, turn_id, m in messages:
        if m.role == "assistant":
            for call in m.tool_calls:
                asked[call.id] = (turn_id, call.name)
                order.append(call.id)
        elif m.role == "tool":
            asked.pop(m.call_id, None)
    return [(asked[c][0], c, asked[c][1]) for c in order if c in asked]


_TURN_COLUMNS: Final = (
    "turn_id, conversation_id, client_msg_id, text, state, reason, created, finished, "
    "steps, tokens, notes"
)


def _turn(row: tuple[Any, ...]) -> TurnRow:
    return TurnRow(
        turn_id=row[0],
        conversation_id=row[1],
        client_msg_id=row[2],
        text=row[3],
        state=row[4],
        reason=row[5],
        created=row[6],
        finished=row[7],
        steps=row[8],
        tokens=row[9],
        notes=list(json.loads(row[10] or "[]")),
    )


def _info(row: tuple[Any, ...]) -> ConversationInfo:
    return ConversationInfo(
        id=row[0],
        channel=row[1],
        origin=row[2],
        created=row[3],
        updated=row[4],
        title=row[5],
        messages=int(row[6]),
        last_seq=int(row[7]),
        principal=_principal(row[8]) if len(row) > 8 else None,
    )


def _principal(raw: object) -> Principal | None:
    if not raw or not isinstance(raw, str):
        return None
    try:
        return _principal_decoder.decode(raw)
    except msgspec.DecodeError:
        # An unreadable owner is nobody's but the owner's (fail closed).
        return None
