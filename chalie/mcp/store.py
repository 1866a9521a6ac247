"""MCP connections in ``chalie.db``: server specs, their live status, the cached tool lists.

Two tables. ``mcp_servers``: one row per connection (the spec as JSON, with
secrets only as references) and its last known status (online/offline, since
when, why, the last heartbeat, the negotiated protocol version, the last
probe latency). ``mcp_tools``: one row per remote tool ever seen, keyed by
(server, remote name): the proxy name (the persisted mapping), the cached
description and input schema (so discovery and descriptors work while the
server is offline), the pinned definition hash, the state
(:data:`chalie.mcp.tools.State`), and a quarantined tool's pending definition.

Several processes may open the file (the daemon, the CLI); SQLite's WAL and
busy timeout serialise them; within a process one lock guards the connection.

Several daemons on one store each keep their own connection to a server, so each has its
own status of it: ``mcp_status`` holds one row per (server, daemon) (:func:`daemon_id`:
the host and the daemon's home). A store opened for a daemon reads that daemon's status
(the shared columns of ``mcp_servers`` hold the last status any daemon wrote, for readers
that name no daemon) and lists the other daemons' beside it (:attr:`ServerRow.daemons`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from chalie.mcp.spec import ServerSpec, decode_spec, encode_spec
from chalie.mcp.tools import RemoteTool, ToolRow
from chalie.store.sql import Store
from chalie.store.store_place import IntegrityError, Place

# needs-login: an OAuth server whose grant needs the owner (chalie mcp login), not offline
Status = Literal["online", "offline", "connecting", "disabled", "needs-login"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS mcp_servers (
    name           TEXT PRIMARY KEY,
    spec           TEXT NOT NULL,
    created_at     REAL NOT NULL,
    status         TEXT NOT NULL DEFAULT 'offline',
    status_since   REAL,
    status_reason  TEXT NOT NULL DEFAULT '',
    last_heartbeat REAL,
    protocol       TEXT NOT NULL DEFAULT '',
    latency_ms     REAL,
    last_error     TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS mcp_tools (
    server      TEXT NOT NULL,
    remote      TEXT NOT NULL,
    proxy       TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL,
    schema      TEXT NOT NULL,
    pin         TEXT NOT NULL,
    state       TEXT NOT NULL,
    changed     TEXT NOT NULL DEFAULT '',
    pending     TEXT,
    first_seen  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    problem     TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (server, remote)
);
CREATE TABLE IF NOT EXISTS mcp_status (
    server         TEXT NOT NULL,
    daemon         TEXT NOT NULL,
    status         TEXT NOT NULL,
    status_since   REAL,
    status_reason  TEXT NOT NULL DEFAULT '',
    last_heartbeat REAL,
    protocol       TEXT NOT NULL DEFAULT '',
    latency_ms     REAL,
    last_error     TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (server, daemon)
);
"""

_json = msgspec.json.Encoder()
_remote = msgspec.json.Decoder(RemoteTool)


# The notice an operator's change to the servers or their tools sends to every daemon on a
# shared store (chalie.store.sql.follow): each reconciles its own connections with the store.
CHANGED: Final = "chalie_mcp"


class ServerExists(ValueError):
    pass


# A connection's status columns, in mcp_servers' and mcp_status' order.
_STATUS_FIELDS: Final = (
    "status",
    "status_since",
    "status_reason",
    "last_heartbeat",
    "protocol",
    "latency_ms",
    "last_error",
)


def _status(values: Iterable[Any]) -> dict[str, Any]:
    return dict(zip(_STATUS_FIELDS, values, strict=True))


def daemon_id(home: Path) -> str:
    """A daemon's name in ``mcp_status``: its host and its home (the same across its
    restarts, another for each daemon on a shared store)."""
    return f"{socket.gethostname()}:{Path(home).resolve()}"


class DaemonStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One daemon's status of its own connection to a server."""

    daemon: str
    status: str
    status_since: float | None = None
    status_reason: str = ""


class ServerRow(msgspec.Struct, frozen=True, kw_only=True):
    spec: ServerSpec
    created_at: float
    status: str = "offline"
    status_since: float | None = None
    status_reason: str = ""
    last_heartbeat: float | None = None
    protocol: str = ""
    latency_ms: float | None = None
    last_error: str = ""
    # The other daemons' statuses of their connections to it (a store opened for a daemon).
    daemons: tuple[DaemonStatus, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


class McpStore(Store):
    """The two tables, for any thread of one process (one lock around the connection)."""

    def __init__(self, path: Place, *, daemon: str | None = None) -> None:
        """``daemon``: whose connection statuses this store writes and reads
        (:func:`daemon_id`); None: the last status any daemon wrote."""
        super().__init__(path, _SCHEMA, racing=True)
        self.daemon = daemon

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, tuple(args)).fetchall()

    # -- servers ---------------------------------------------------------------
    _SERVER_COLS: Final = (
        "spec, created_at, status, status_since, status_reason, last_heartbeat, protocol, "
        "latency_ms, last_error"
    )

    @staticmethod
    def _server(row: Any) -> ServerRow:
        spec, created, *status = row
        return ServerRow(spec=decode_spec(spec), created_at=created, **_status(status))

    def servers(self) -> list[ServerRow]:
        return self._servers(None)

    def server(self, name: str) -> ServerRow | None:
        found = self._servers(name)
        return found[0] if found else None

    def _servers(self, name: str | None) -> list[ServerRow]:
        where, args = ("", ()) if name is None else (" WHERE name = ?", (name,))
        rows = [
            self._server(r)
            for r in self._rows(
                f"SELECT {self._SERVER_COLS} FROM mcp_servers{where} ORDER BY name", args
            )
        ]
        if self.daemon is None or not rows:
            return rows
        status_where = "" if name is None else " WHERE server = ?"
        per: dict[str, list[tuple[Any, ...]]] = {}
        for r in self._rows(
            "SELECT server, daemon, status, status_since, status_reason, last_heartbeat, "
            f"protocol, latency_ms, last_error FROM mcp_status{status_where} ORDER BY daemon",
            args,
        ):
            per.setdefault(r[0], []).append(tuple(r))
        return [self._overlay(row, per.get(row.name, [])) for row in rows]

    def _overlay(self, row: ServerRow, statuses: list[tuple[Any, ...]]) -> ServerRow:
        """The row as this daemon sees it: its own status, the others' beside it."""
        own = next((s for s in statuses if s[1] == self.daemon), None)
        others = tuple(
            DaemonStatus(daemon=s[1], status=s[2], status_since=s[3], status_reason=s[4])
            for s in statuses
            if s[1] != self.daemon
        )
        if own is None:  # not connected from here yet
            return msgspec.structs.replace(row, daemons=others)
        return msgspec.structs.replace(row, **_status(own[2:]), daemons=others)

    def add_server(self, spec: ServerSpec, *, replace: bool = False) -> None:
        now = time.time()
        with self._lock:
            if replace:
                cur = self._conn.execute(
                    "UPDATE mcp_servers SET spec = ? WHERE name = ?", (encode_spec(spec), spec.name)
                )
                if cur.rowcount:
                    return
            try:
                self._conn.execute(
                    "INSERT INTO mcp_servers (name, spec, created_at, status, status_since) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        spec.name,
                        encode_spec(spec),
                        now,
                        "offline" if spec.enabled else "disabled",
                        now,
                    ),
                )
            except IntegrityError:
                raise ServerExists(f"an MCP server named {spec.name!r} already exists") from None

    def set_enabled(self, name: str, enabled: bool) -> bool:
        row = self.server(name)
        if row is None:
            return False
        spec = msgspec.structs.replace(row.spec, enabled=enabled)
        with self._lock:
            self._conn.execute(
                "UPDATE mcp_servers SET spec = ?, status = ?, status_since = ?, status_reason = ? "
                "WHERE name = ?",
                (
                    encode_spec(spec),
                    "offline" if enabled else "disabled",
                    time.time(),
                    "" if enabled else "disabled by the operator",
                    name,
                ),
            )
        return True

    def changed(self) -> None:
        """Tell every daemon on the store that the operator changed something here."""
        with self._lock:
            self._conn.notify(CHANGED)

    def remove_server(self, name: str) -> bool:
        with self._lock, self._conn.transaction() as tx:
            cur = tx.execute("DELETE FROM mcp_servers WHERE name = ?", (name,))
            tx.execute("DELETE FROM mcp_tools WHERE server = ?", (name,))
            tx.execute("DELETE FROM mcp_status WHERE server = ?", (name,))
            return cur.rowcount > 0

    def set_status(
        self,
        name: str,
        status: Status,
        *,
        reason: str = "",
        since: float | None = None,
        protocol: str | None = None,
        latency_ms: float | None = None,
        heartbeat: float | None = None,
        error: str | None = None,
    ) -> None:
        sets = ["status = ?", "status_reason = ?"]
        args: list[Any] = [status, reason[:500]]
        for column, value in (
            ("status_since", since),
            ("protocol", protocol),
            ("latency_ms", latency_ms),
            ("last_heartbeat", heartbeat),
            ("last_error", None if error is None else error[:500]),
        ):
            if value is not None:
                sets.append(f"{column} = ?")
                args.append(value)
        with self._lock:
            self._conn.execute(
                f"UPDATE mcp_servers SET {', '.join(sets)} WHERE name = ?", (*args, name)
            )
            if self.daemon is not None:
                self._set_own_status(name, sets, args)

    def _set_own_status(self, name: str, sets: list[str], args: list[Any]) -> None:
        """This daemon's row of ``mcp_status`` (under the lock): the same columns."""
        columns = [s.split(" = ")[0] for s in sets]
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns)
        self._conn.execute(
            f"INSERT INTO mcp_status (server, daemon, {', '.join(columns)}) "
            f"SELECT ?, ?, {', '.join('?' * len(columns))} "
            "WHERE EXISTS (SELECT 1 FROM mcp_servers WHERE name = ?) "
            f"ON CONFLICT (server, daemon) DO UPDATE SET {updates}",
            (name, self.daemon, *args, name),
        )

    # -- tools -------------------------------------------------------------------
    _TOOL_COLS: Final = (
        "server, remote, proxy, description, schema, pin, state, changed, pending, first_seen, "
        "updated_at, problem"
    )

    @staticmethod
    def _tool(row: Any) -> ToolRow:
        (
            server,
            remote,
            proxy,
            description,
            schema,
            pin,
            state,
            changed,
            pending,
            first,
            updated,
            problem,
        ) = row
        return ToolRow(
            server=server,
            remote=remote,
            proxy=proxy,
            description=description,
            schema=msgspec.json.decode(schema),
            pin=pin,
            state=state,
            changed=changed,
            pending=_remote.decode(pending) if pending else None,
            first_seen=first,
            updated_at=updated,
            problem=problem,
        )

    def tools(self, server: str | None = None) -> list[ToolRow]:
        if server is None:
            rows = self._rows(f"SELECT {self._TOOL_COLS} FROM mcp_tools ORDER BY proxy")
        else:
            rows = self._rows(
                f"SELECT {self._TOOL_COLS} FROM mcp_tools WHERE server = ? ORDER BY proxy",
                (server,),
            )
        return [self._tool(r) for r in rows]

    def tool_by_proxy(self, proxy: str) -> ToolRow | None:
        rows = self._rows(f"SELECT {self._TOOL_COLS} FROM mcp_tools WHERE proxy = ?", (proxy,))
        return self._tool(rows[0]) if rows else None

    def taken_names(self) -> dict[str, str]:
        """proxy → ``server/remote`` for every name ever assigned (the persisted mapping)."""
        return {
            p: f"{s}/{r}" for s, r, p in self._rows("SELECT server, remote, proxy FROM mcp_tools")
        }

    def write_tools(self, rows: Iterable[ToolRow]) -> int:
        """Insert or replace rows, in one transaction."""
        values = [
            (
                r.server,
                r.remote,
                r.proxy,
                r.description,
                _json.encode(r.schema).decode(),
                r.pin,
                r.state,
                r.changed,
                _json.encode(r.pending).decode() if r.pending is not None else None,
                r.first_seen,
                r.updated_at,
                r.problem,
            )
            for r in rows
        ]
        if not values:
            return 0
        updates = ", ".join(
            f"{c} = excluded.{c}" for c in self._TOOL_COLS.split(", ")[2:]
        )  # every column but the key (server, remote)
        with self._lock, self._conn.transaction() as tx:
            tx.executemany(
                f"INSERT INTO mcp_tools ({self._TOOL_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                f"ON CONFLICT (server, remote) DO UPDATE SET {updates}",
                values,
            )
        return len(values)
