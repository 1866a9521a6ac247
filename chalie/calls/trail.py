"""The action trail: one row per tool call, written at its start and completed at its end.

A row holds the call, turn and conversation ids, the channel, tool and
permission, the gate's decision and who made it, the parameters as JSON with
sensitive values replaced by ``[redacted]``, the status, the error code, the
act_summary, the principal id of the turn, and start and end times. Every write is its own committed
transaction (see :mod:`chalie.db` for why WAL + ``synchronous=NORMAL``
survives a SIGKILL), so a call whose outcome was returned is on disk. Rows
left ``running`` by a daemon that died are marked ``interrupted`` by
:meth:`Trail.recover` at the next start. A caller may defer a start row
(:meth:`Trail.defer_start`) so a call that ends quickly costs one insert.

The trail lives in the store (:mod:`chalie.store.sql`): the SQLite file, or a PostgreSQL
database several daemons share. Two things make that safe. Row ids are reserved in
blocks (:data:`ID_BLOCK` at a time, one statement a block, from the ``id_blocks`` row),
so two writers never reserve one id. Each row names its writer (a random id a process,
whose lease, :meth:`chalie.store.sql.Connection.lease`, the writing connection holds from its
first write to its end), and recovery marks ``interrupted`` only the rows of this
process's writer (an earlier run of its dispatcher) and of writers whose lease is free:
a daemon that starts never touches the calls another live daemon is running.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import msgspec

from chalie.store.sql import add_columns, open_connection
from chalie.store.store_place import Place, StoreError
from chalie.wire.messages import TRAIL_STATUSES, TrailStatus
from chalie.wire.messages import Status as CallStatus

REDACTED: Final = "[redacted]"
# Keys that name a secret are redacted at any depth, declared or not.
SECRET_KEY: Final = re.compile(
    r"(?i)(passw(or)?d|passphrase|secret|token|api[_-]?key|auth(orization)?|credential|private[_-]?key|cookie)"
)
MAX_PARAMS_CHARS: Final = 16_384
MAX_TEXT: Final = 512
MAX_QUERY_ROWS: Final = 1000
MAX_DEPTH: Final = 32

Status = TrailStatus
STATUSES: Final = TRAIL_STATUSES

# No secondary indexes: each one adds ~4 us to every call's insert on the
# dispatcher's hot path, while queries walk newest-first by the primary key
# and recovery scans once at start-up.
_SCHEMA: Final = """
    CREATE TABLE IF NOT EXISTS trail (
        id              INTEGER PRIMARY KEY,
        call_id         TEXT NOT NULL,
        turn_id         TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        channel         TEXT NOT NULL,
        tool            TEXT NOT NULL,
        permission      TEXT,
        decision        TEXT,
        decided_by      TEXT,
        params          TEXT NOT NULL DEFAULT '{}',
        status          TEXT NOT NULL,
        code            TEXT,
        act_summary     TEXT NOT NULL DEFAULT '',
        background      INTEGER NOT NULL DEFAULT 0,
        started_at      REAL NOT NULL,
        ended_at        REAL,
        healed          TEXT NOT NULL DEFAULT '',
        parent_call_id  TEXT NOT NULL DEFAULT '',
        principal       TEXT NOT NULL DEFAULT '',
        writer          TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE IF NOT EXISTS id_blocks (
        name TEXT PRIMARY KEY,
        next INTEGER NOT NULL
    );
    """
# Columns added after the first release, each with the ALTER that adds it to an older file.
_ADDED: Final = {
    "healed": "ALTER TABLE trail ADD COLUMN healed TEXT NOT NULL DEFAULT ''",
    "parent_call_id": "ALTER TABLE trail ADD COLUMN parent_call_id TEXT NOT NULL DEFAULT ''",
    "principal": "ALTER TABLE trail ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
    # the writer (its lease) the row's call ran under: recovery leaves a live writer's rows
    "writer": "ALTER TABLE trail ADD COLUMN writer TEXT NOT NULL DEFAULT ''",
}
# Row ids a writer reserves at a time (one statement each block).
ID_BLOCK: Final = 256
LEASE_PREFIX: Final = "trail-writer:"

log = logging.getLogger("chalie.calls.trail")

_json = msgspec.json.Encoder()


class TrailCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call as an operator is shown it (the REST API's trail row derives from this)."""

    id: int
    call_id: str
    turn_id: str
    conversation_id: str
    channel: str
    tool: str
    permission: str | None
    decision: str | None
    decided_by: str | None
    params: str
    status: str
    code: str | None
    act_summary: str
    background: bool
    started_at: float
    ended_at: float | None
    # The principal id of the turn (chalie.wire.principals); '' for a row from before the column.
    principal: str = ""


class TrailRow(TrailCall, frozen=True, kw_only=True):
    """A stored row: the call as shown, and what the dispatcher keeps beside it."""

    # What the dispatcher healed in the model's arguments (chalie.calls.healing), "; "-joined.
    healed: str = ""
    # The call that started the delegate sub-turn this call ran in ('' for none).
    parent_call_id: str = ""


_COLUMNS: Final = tuple(TrailRow.__struct_fields__)


def _redact_value(value: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        return "[too deep]"
    if isinstance(value, Mapping):
        return {
            str(k): REDACTED if SECRET_KEY.search(str(k)) else _redact_value(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact_value(v, depth + 1) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)[:MAX_TEXT]


# Whether a key names a secret, per key seen (parameter names repeat call after call).
_SECRET_NAMES: dict[str, bool] = {}
_SECRET_NAMES_MAX: Final = 8192


def _secret_name(name: str) -> bool:
    found = _SECRET_NAMES.get(name)
    if found is None:
        found = SECRET_KEY.search(name) is not None
        if len(_SECRET_NAMES) >= _SECRET_NAMES_MAX:
            _SECRET_NAMES.clear()
        _SECRET_NAMES[name] = found
    return found


_PLAIN: Final = (str, int, float, bool, type(None))


def redact(params: Mapping[str, Any], sensitive: Iterable[str] = ()) -> dict[str, Any]:
    """A copy safe to store or show: declared sensitive names and secret-looking keys hidden."""
    declared = sensitive if isinstance(sensitive, frozenset | set | tuple) else frozenset(sensitive)
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = key if type(key) is str else str(key)
        if name in declared or _secret_name(name):
            out[name] = REDACTED
        elif type(value) in _PLAIN:
            out[name] = value
        else:
            out[name] = _redact_value(value, 1)
    return out


def params_json(redacted: Mapping[str, Any]) -> str:
    try:
        text = _json.encode(redacted).decode()
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
        return '{"_unencodable":true}'
    if len(text) > MAX_PARAMS_CHARS:
        return _json.encode({"_truncated": True, "prefix": text[:MAX_PARAMS_CHARS]}).decode()
    return text


def _clip(text: str | None) -> str:
    return (text or "")[:MAX_TEXT]


class CallRecord(msgspec.Struct, kw_only=True):
    """What the trail knows of a call when it starts; its row id is reserved in advance."""

    id: int
    call_id: str
    turn_id: str
    conversation_id: str
    channel: str
    tool: str
    permission: str | None
    params: str
    act_summary: str
    background: bool = False
    started_at: float = 0.0
    healed: str = ""
    parent_call_id: str = ""
    principal: str = ""


_INSERT: Final = (
    "INSERT INTO trail (id, call_id, turn_id, conversation_id, channel, tool, permission, "
    "decision, decided_by, params, status, code, act_summary, background, started_at, ended_at, "
    "healed, parent_call_id, principal, writer) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

# A finished call's row as :meth:`Trail.finish` sends it (Connection.send): written again
# when its commit is not confirmed, so writing it twice keeps one row.
_INSERT_AGAIN: Final = _INSERT + " ON CONFLICT (id) DO NOTHING"

_WRITER: dict[int, str] = {}


def process_writer() -> str:
    """This process's trail writer id (random, one per process)."""
    pid = os.getpid()
    found = _WRITER.get(pid)
    if found is None:
        found = _WRITER.setdefault(pid, secrets.token_hex(8))
    return found


class Trail:
    """The trail table on one connection; safe to call from any thread.

    One Trail writes a database file (the dispatcher's); others may read it.
    Row ids are reserved in memory (:meth:`reserve`) so a call's start and
    end can be written from two threads in either order: :meth:`start`
    writes the ``running`` row, :meth:`finish` completes it, and if the end
    comes first it writes the whole row itself and the late start is
    skipped. Either way the end is committed before :meth:`finish` returns on
    SQLite; on PostgreSQL it is sent whole to a session that will run it, and
    confirmed (or written again) at :meth:`settle` (docs/store.rst, the hot path).
    """

    def __init__(self, place: Place, *, writer: str | None = None) -> None:
        self.place = place
        self._conn = open_connection(place)
        self._lock = threading.Lock()
        self._conn.script(_SCHEMA)
        add_columns(self._conn, "trail", _ADDED)
        # An id_blocks row starts past every id a store from before blocks holds.
        self._conn.execute(
            "INSERT INTO id_blocks (name, next) SELECT 'trail', COALESCE(MAX(id), 0) + 1 "
            "FROM trail WHERE true ON CONFLICT (name) DO NOTHING"
        )
        # This process's writer id unless told (tests play several daemons in one process).
        self.writer = writer or process_writer()
        self._leased = False  # taken at the first write: a reader holds no lease
        self._ids: Iterator[int] = iter(())
        self._ids_lock = threading.Lock()
        self._running: set[int] = set()
        self._ended_first: set[int] = set()
        # Deferred starts in the order they came, each with its monotonic time.
        self._deferred: dict[int, tuple[float, CallRecord]] = {}
        # Ends sent without waiting for their commit (finish), in order, until confirmed;
        # and whether they must be written again (a commit was not confirmed).
        self._sent: list[tuple[str, tuple[Any, ...]]] = []
        self._resend = False

    def close(self) -> None:
        with self._lock:
            try:
                self._settle()
            finally:
                self._conn.close()

    def settle(self, *, wait: bool = True) -> bool:
        """Make sure the calls' ends that :meth:`finish` sent are committed: read the
        store's answers, and write them again, in order, if a commit is not confirmed
        (raises :class:`~chalie.store.store_place.StoreError` when that fails too: tried again
        at the next write). ``wait=False``: only the answers already here are read; False
        while some are still on their way (the dispatcher's thread never waits for them)."""
        with self._lock:
            return self._settle(wait=wait)

    def unsettled(self) -> bool:
        """Whether ends were sent whose commit is not confirmed yet (:meth:`settle`)."""
        with self._lock:
            return bool(self._sent)

    def _settle(self, *, wait: bool = True) -> bool:
        if not self._sent:
            return True
        if not self._resend:
            try:
                if not self._conn.confirm(wait=wait):
                    return False
                self._sent.clear()
                return True
            except StoreError as exc:
                self._resend = True
                log.warning(
                    "the commit of %d trail rows was not confirmed (%s): writing them again",
                    len(self._sent),
                    exc,
                )
        with self._conn.transaction():  # each is idempotent: a row committed stays one row
            for sql, values in self._sent:
                self._conn.execute(sql, values)
        self._sent.clear()
        self._resend = False
        return True

    def recover(self) -> int:
        """Mark calls a dead daemon left running as ``interrupted``; returns how many.

        Their end is unknown (the daemon died somewhere in between), so ``ended_at``
        stays empty rather than holding the time of the restart.
        """
        return len(self.recover_calls())

    def recover_calls(self) -> list[tuple[str, str, str, bool]]:
        """:meth:`recover`, returning each call marked: (call id, conversation id, tool,
        whether it ran in the background: its conversation still waits for its result)."""
        with self._lock:
            self._settle()
            writers = [
                str(r[0])
                for r in self._conn.execute(
                    "SELECT DISTINCT writer FROM trail WHERE status = 'running'"
                ).fetchall()
            ]
            # This writer's own rows are an earlier run's (a dispatcher restarted after a
            # crash, in this process); another's only once its lease is free (it is gone).
            dead = [
                w for w in writers if w == self.writer or not self._conn.leased(LEASE_PREFIX + w)
            ]
            rows: list[Any] = []
            for writer in dead:
                rows += self._conn.execute(
                    "UPDATE trail SET status = 'interrupted', code = 'interrupted', "
                    "ended_at = NULL WHERE status = 'running' AND writer = ? "
                    "RETURNING call_id, conversation_id, tool, background, id",
                    (writer,),
                ).fetchall()
        rows.sort(key=lambda r: int(r[4]))
        return [(str(r[0]), str(r[1]), str(r[2]), bool(r[3])) for r in rows]

    def reserve(self) -> int:
        with self._ids_lock:
            found = next(self._ids, None)
            if found is None:
                with self._lock:
                    self._settle()
                    row = self._conn.execute(
                        "UPDATE id_blocks SET next = next + ? WHERE name = 'trail' RETURNING next",
                        (ID_BLOCK,),
                    ).fetchone()
                top = int(row[0])
                self._ids = iter(range(top - ID_BLOCK + 1, top))
                found = top - ID_BLOCK
            return found

    def record_for(
        self,
        *,
        call_id: str,
        turn_id: str,
        conversation_id: str,
        channel: str,
        tool: str,
        permission: str | None,
        params: str,
        act_summary: str,
        background: bool = False,
        healed: str = "",
        parent_call_id: str = "",
        principal: str = "",
    ) -> CallRecord:
        """A CallRecord with a reserved id and clipped text fields, started now."""
        return CallRecord(
            id=self.reserve(),
            call_id=_clip(call_id),
            turn_id=_clip(turn_id),
            conversation_id=_clip(conversation_id),
            channel=_clip(channel),
            tool=_clip(tool),
            permission=permission,
            params=params,
            act_summary=_clip(act_summary),
            background=background,
            started_at=time.time(),
            healed=_clip(healed),
            parent_call_id=_clip(parent_call_id),
            principal=_clip(principal),
        )

    def _insert(
        self,
        rec: CallRecord,
        status: str,
        code: str | None,
        decision: str | None,
        decided_by: str | None,
        ended_at: float | None,
        *,
        send: bool = False,
    ) -> None:
        if not self._leased:
            self._leased = True
            self._conn.lease(LEASE_PREFIX + self.writer)  # False: another of ours holds it
        values = (
            rec.id,
            rec.call_id,
            rec.turn_id,
            rec.conversation_id,
            rec.channel,
            rec.tool,
            rec.permission,
            decision,
            decided_by,
            rec.params,
            status,
            code,
            rec.act_summary,
            int(rec.background),
            rec.started_at,
            ended_at,
            rec.healed,
            rec.parent_call_id,
            rec.principal,
            self.writer,
        )
        if send:
            self._send(_INSERT_AGAIN, values)
        else:
            self._conn.execute(_INSERT, values)

    def _send(self, sql: str, values: tuple[Any, ...]) -> None:
        if self._resend:  # an earlier one must be written again first: this one too
            self._sent.append((sql, values))
            self._settle()
            return
        try:
            if self._conn.send(sql, values):
                self._sent.append((sql, values))
        except StoreError:
            self._sent.append((sql, values))
            self._resend = True  # not sent whole: written again at the next settle
            raise

    def start(self, rec: CallRecord) -> None:
        """Write the ``running`` row, unless the call already ended (then its row is complete)."""
        with self._lock:
            if rec.id in self._ended_first:
                self._ended_first.discard(rec.id)
                return
            self._settle()
            self._insert(rec, "running", None, None, None, None)
            self._running.add(rec.id)

    def defer_start(self, rec: CallRecord) -> None:
        """Hold the ``running`` row until :meth:`flush_starts`; an end before that writes one row.

        For calls that usually end within microseconds: their start and end
        become one insert. The caller must flush soon (the dispatcher does
        within a few ms), since a crash before the flush leaves no row for a
        call that had not returned anything yet.
        """
        with self._lock:
            if rec.id in self._ended_first:
                self._ended_first.discard(rec.id)
                return
            self._deferred[rec.id] = (time.monotonic(), rec)

    def flush_starts(self, age: float = 0.0) -> tuple[int, float | None]:
        """Write the deferred ``running`` rows held at least ``age`` seconds, in one transaction.

        Returns how many were written and, when some are still held, the
        seconds until the oldest of them is ``age`` old (else None). A call
        that started a moment ago is left to end as one row.
        """
        with self._lock:
            if not self._deferred:
                return 0, None
            now = time.monotonic()
            recs: list[CallRecord] = []
            wait: float | None = None
            for rid, (since, rec) in list(self._deferred.items()):
                if now - since < age:
                    wait = since + age - now
                    break  # deferred in order: the rest are younger still
                del self._deferred[rid]
                recs.append(rec)
            if recs:
                self._settle()
                with self._conn.transaction():
                    for rec in recs:
                        self._insert(rec, "running", None, None, None, None)
                self._running.update(rec.id for rec in recs)
            return len(recs), wait

    def deferred(self) -> int:
        """How many ``running`` rows are held back now."""
        with self._lock:
            return len(self._deferred)

    def finish(
        self,
        rec: CallRecord,
        *,
        status: CallStatus,
        code: str | None,
        decision: str | None,
        decided_by: str | None,
        started: bool = True,
    ) -> None:
        """Complete the call's row. ``started=False``: no start will come.

        On SQLite the row is committed on return. On PostgreSQL it is sent whole to the
        server, which commits it on its own, without waiting for the answer
        (:meth:`Connection.send`: the caller does not pay the round trip; several may be
        in flight). The answers are read as they come and all of them at :meth:`settle`
        (the dispatcher's flush, within ms, or any other use of the trail); rows whose
        commit is not confirmed are written again then, in order.
        """
        now = time.time()
        with self._lock:
            if rec.id in self._running:
                self._running.discard(rec.id)
                self._send(
                    "UPDATE trail SET status = ?, code = ?, decision = ?, decided_by = ?, "
                    "ended_at = ? WHERE id = ?",
                    (status, code, decision, decided_by, now, rec.id),
                )
                return
            deferred = self._deferred.pop(rec.id, None) is not None
            self._insert(rec, status, code, decision, decided_by, now, send=True)
            if started and not deferred:
                self._ended_first.add(rec.id)

    def ended_since(self, since: float) -> list[tuple[str, str, float | None]]:
        """``(tool, status, seconds)`` of every call started at or after ``since`` (seconds:
        None while it runs); what :func:`chalie.calls.usage.summarize` reads. A scan of the
        window's rows: no index slows the dispatcher's inserts for it."""
        with self._lock:
            self._settle()
            found = self._conn.execute(
                "SELECT tool, status, ended_at - started_at FROM trail WHERE started_at >= ?",
                (float(since),),
            ).fetchall()
        return [(str(t), str(s), None if d is None else float(d)) for t, s, d in found]

    def query(
        self,
        *,
        limit: int = 50,
        tool: str | None = None,
        status: str | None = None,
        code: str | None = None,
        channel: str | None = None,
        conversation_id: str | None = None,
        turn_id: str | None = None,
        call_id: str | None = None,
        parent_call_id: str | None = None,
        decided_by: str | None = None,
        principal: str | None = None,
        since: float | None = None,
        until: float | None = None,
        before: int | None = None,
    ) -> list[TrailRow]:
        """Recent calls, newest first, filtered by any of the given fields.

        ``before`` pages by keyset: only rows whose id is below it (the last id of the
        previous page), so a page deep in a large trail costs what the first one does.
        """
        bad = isinstance(limit, bool) or not isinstance(limit, int)
        if bad or not 1 <= limit <= MAX_QUERY_ROWS:
            raise ValueError(f"limit must be an integer from 1 to {MAX_QUERY_ROWS}")
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; statuses are {', '.join(STATUSES)}")
        clauses: list[str] = []
        args: list[Any] = []
        for column, value in (
            ("tool", tool),
            ("status", status),
            ("code", code),
            ("channel", channel),
            ("conversation_id", conversation_id),
            ("turn_id", turn_id),
            ("call_id", call_id),
            ("parent_call_id", parent_call_id),
            ("decided_by", decided_by),
            ("principal", principal),
        ):
            if value is not None:
                if not isinstance(value, str):
                    raise ValueError(f"{column} filter must be a string")
                clauses.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            clauses.append("started_at >= ?")
            args.append(float(since))
        if until is not None:
            clauses.append("started_at < ?")
            args.append(float(until))
        if before is not None:
            if isinstance(before, bool) or not isinstance(before, int):
                raise ValueError("before must be an integer row id")
            clauses.append("id < ?")
            args.append(before)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        with self._lock:
            self._settle()
            rows = self._conn.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM trail {where}ORDER BY id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        out = []
        for row in rows:
            fields = dict(zip(_COLUMNS, row, strict=True))
            fields["background"] = bool(fields["background"])
            out.append(TrailRow(**fields))
        return out
