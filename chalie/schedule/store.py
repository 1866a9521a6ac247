"""The ``reminders`` table in chalie.db: every reminder, its rule, its zone and its next firing.

A pending reminder's ``next_fire`` is the UTC epoch second it is due. Firing
one is two writes: :meth:`ReminderStore.fired` records the firing (and the
next time, or ``done``) in one statement before its turn starts, so it is fired
once however many daemons share the store; the answer is recorded afterwards.

A firing is *claimed* until its answer is delivered: the row names the claimant (a
daemon's scheduler, one random id a run) and the claimant holds a lease of that name
(:meth:`chalie.store.sql.Connection.lease`, gone with its session). A claimant that dies
before delivering (a kill -9 mid-turn) leaves a claim whose lease is free:
:meth:`ReminderStore.orphaned` finds it and :meth:`ReminderStore.reclaim` takes it over,
once, for another scheduler (on another daemon, or this one's next run) to fire it
again. Nothing is lost; a firing whose answer was being delivered when its claimant died
may be told twice.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from chalie.schedule.rules import RuleKind
from chalie.store.sql import Store, add_columns
from chalie.store.store_place import Place

State = Literal["pending", "done", "cancelled"]
# The owner's views of the table (the dashboard's filter).
Shown = Literal["pending", "fired", "late", "all"]
MAX_TEXT: Final = 2000

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS reminders (
    id              INTEGER PRIMARY KEY,
    text            TEXT NOT NULL,
    kind            TEXT NOT NULL,
    rule            TEXT NOT NULL,
    zone            TEXT NOT NULL,
    principal       TEXT NOT NULL,
    conversation_id TEXT,
    created         REAL NOT NULL,
    next_fire       REAL,
    state           TEXT NOT NULL,
    fired           INTEGER NOT NULL DEFAULT 0,
    last_fired      REAL,
    last_late       INTEGER NOT NULL DEFAULT 0,
    last_answer     TEXT
);
CREATE INDEX IF NOT EXISTS reminders_due ON reminders (next_fire) WHERE state = 'pending';
"""
# Who claimed the last firing and has not delivered its answer yet (NULL: nobody).
_LATER_COLUMNS: Final = {"claimed_by": "ALTER TABLE reminders ADD COLUMN claimed_by TEXT"}
# The notice a new reminder sends every daemon on a shared store (their schedulers re-arm).
ADDED: Final = "chalie_reminders"
# A claimant's lease: held by its store's connection for as long as it runs.
CLAIM_LEASE: Final = "reminders-claimant:"
_COLUMNS: Final = (
    "id, text, kind, rule, zone, principal, conversation_id, created, next_fire, state, "
    "fired, last_fired, last_late, last_answer"
)


class Reminder(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    text: str
    kind: RuleKind
    rule: str
    zone: str
    principal: str
    conversation_id: str | None
    created: float
    next_fire: float | None
    state: State
    fired: int = 0
    last_fired: float | None = None
    last_late: bool = False
    last_answer: str | None = None


def _row(r: Any) -> Reminder:
    return Reminder(
        id=int(r[0]),
        text=str(r[1]),
        kind=r[2],
        rule=str(r[3]),
        zone=str(r[4]),
        principal=str(r[5]),
        conversation_id=r[6],
        created=float(r[7]),
        next_fire=None if r[8] is None else float(r[8]),
        state=r[9],
        fired=int(r[10]),
        last_fired=r[11],
        last_late=bool(r[12]),
        last_answer=r[13],
    )


class ReminderStore(Store):
    """One connection, any thread (a lock serialises it)."""

    def __init__(self, db_path: Place, *, claimant: str | None = None) -> None:
        """``claimant``: this scheduler's id (one a run), whose lease the store holds;
        None for a store that never fires (the CLI's, a copy's)."""
        super().__init__(db_path, _SCHEMA)
        self.claimant = claimant
        with self._lock:
            add_columns(self._conn, "reminders", _LATER_COLUMNS)
            if claimant is not None and not self._conn.lease(CLAIM_LEASE + claimant):
                raise RuntimeError(f"the reminders claimant {claimant!r} is taken")

    def add(
        self,
        *,
        text: str,
        kind: RuleKind,
        rule: str,
        zone: str,
        principal: str,
        conversation_id: str | None,
        created: float,
        next_fire: float,
    ) -> Reminder:
        with self._lock:
            row = self._conn.execute(
                "INSERT INTO reminders (text, kind, rule, zone, principal, conversation_id, "
                "created, next_fire, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending') "
                f"RETURNING {_COLUMNS}",
                (text, kind, rule, zone, principal, conversation_id, created, next_fire),
            ).fetchone()
            self._conn.notify(ADDED)
        return _row(row)

    def add_many(self, rows: list[tuple[str, str, str, str, str, float, float]]) -> None:
        """Bulk insert (text, kind, rule, zone, principal, created, next_fire): benchmarks."""
        with self._lock, self._conn.transaction() as tx:
            tx.executemany(
                "INSERT INTO reminders (text, kind, rule, zone, principal, created, next_fire, "
                "state) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending')",
                rows,
            )

    def get(self, reminder_id: int) -> Reminder | None:
        with self._lock:
            r = self._conn.execute(
                f"SELECT {_COLUMNS} FROM reminders WHERE id = ?", (reminder_id,)
            ).fetchone()
        return None if r is None else _row(r)

    def listed(
        self, *, principal: str | None = None, pending_only: bool = True, limit: int = 100
    ) -> list[Reminder]:
        where = ["1 = 1"]
        args: list[Any] = []
        if pending_only:
            where.append("state = 'pending'")
        if principal is not None:
            where.append("principal = ?")
            args.append(principal)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM reminders WHERE {' AND '.join(where)} "
                "ORDER BY COALESCE(next_fire, 1e18), id LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_row(r) for r in rows]

    def shown(self, view: Shown, limit: int = 100) -> list[Reminder]:
        """Everyone's reminders for the owner's view: pending ones next due first; fired or
        late ones (their last firing was late) newest firing first; all, newest first."""
        where, order = {
            "pending": ("state = 'pending'", "COALESCE(next_fire, 1e18), id"),
            "fired": ("fired > 0", "last_fired DESC, id DESC"),
            "late": ("fired > 0 AND last_late = 1", "last_fired DESC, id DESC"),
            "all": ("1 = 1", "id DESC"),
        }[view]
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM reminders WHERE {where} ORDER BY {order} LIMIT ?",
                (limit,),
            ).fetchall()
        return [_row(r) for r in rows]

    def next_due(self) -> float | None:
        with self._lock:
            r = self._conn.execute(
                "SELECT MIN(next_fire) FROM reminders WHERE state = 'pending'"
            ).fetchone()
        return None if r is None or r[0] is None else float(r[0])

    def due(self, now: float, limit: int = 100) -> list[Reminder]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM reminders WHERE state = 'pending' AND next_fire <= ? "
                "ORDER BY next_fire, id LIMIT ?",
                (now, limit),
            ).fetchall()
        return [_row(r) for r in rows]

    def fired(
        self,
        reminder_id: int,
        *,
        at: float,
        late: bool,
        next_fire: float | None,
        due: float | None = None,
    ) -> bool:
        """Record a firing (and the next time, or ``done``); True when this call claimed it.
        With ``due`` (the time :meth:`due` read) it is a compare-and-set: of several daemons
        on one store that saw the reminder due, exactly one claims each firing."""
        state = "done" if next_fire is None else "pending"
        same = "" if due is None else " AND next_fire = ?"
        with self._lock:
            cur = self._conn.execute(
                "UPDATE reminders SET fired = fired + 1, last_fired = ?, last_late = ?, "
                "next_fire = ?, state = ?, claimed_by = ? "
                f"WHERE id = ? AND state = 'pending'{same}",
                (
                    at,
                    int(late),
                    next_fire,
                    state,
                    self.claimant,
                    reminder_id,
                    *(() if due is None else (due,)),
                ),
            )
        return cur.rowcount == 1

    def delivered(self, reminder_id: int) -> None:
        """This claimant's firing of the reminder is delivered (or will never be): unclaimed."""
        with self._lock:
            self._conn.execute(
                "UPDATE reminders SET claimed_by = NULL WHERE id = ? AND claimed_by = ?",
                (reminder_id, self.claimant),
            )

    def orphaned(self) -> tuple[list[tuple[Reminder, str]], set[str]]:
        """Firings claimed by a claimant that is gone (its lease free), each with that
        claimant; and the live claimants of other firings (another daemon's scheduler)."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS}, claimed_by FROM reminders WHERE claimed_by IS NOT NULL "
                "AND claimed_by != ? AND state != 'cancelled' ORDER BY last_fired, id",
                (self.claimant or "",),
            ).fetchall()
            live: dict[str, bool] = {}
            for r in rows:
                if r[-1] not in live:
                    live[r[-1]] = self._conn.leased(CLAIM_LEASE + r[-1])
        gone = [(_row(r), str(r[-1])) for r in rows if not live[r[-1]]]
        return gone, {c for c, alive in live.items() if alive}

    def reclaim(self, reminder_id: int, claimant: str) -> bool:
        """Take over ``claimant``'s firing of the reminder; True for the one that got it."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE reminders SET claimed_by = ? WHERE id = ? AND claimed_by = ?",
                (self.claimant, reminder_id, claimant),
            )
        return cur.rowcount == 1

    def answered(self, reminder_id: int, answer: str) -> None:
        with self._lock:
            self._conn.execute(
                "UPDATE reminders SET last_answer = ? WHERE id = ?",
                (answer[:MAX_TEXT], reminder_id),
            )

    def cancel(self, reminder_id: int, principal: str | None = None) -> bool:
        with self._lock:
            if principal is None:
                cur = self._conn.execute(
                    "UPDATE reminders SET state = 'cancelled', next_fire = NULL "
                    "WHERE id = ? AND state = 'pending'",
                    (reminder_id,),
                )
            else:
                cur = self._conn.execute(
                    "UPDATE reminders SET state = 'cancelled', next_fire = NULL "
                    "WHERE id = ? AND state = 'pending' AND principal = ?",
                    (reminder_id, principal),
                )
        return cur.rowcount > 0

    def pending_count(self) -> int:
        with self._lock:
            return int(
                self._conn.execute(
                    "SELECT COUNT(*) FROM reminders WHERE state = 'pending'"
                ).fetchone()[0]
            )
