"""Copying one store into another (``chalie store migrate``): a SQLite home into PostgreSQL.

Both stores' tables exist before the copy (every store module made its own, on both
sides: :func:`chalie_app.cli.store` opens them). Then, in one transaction on the target,
every table of the source is copied row by row, the columns both sides have; a value the
source holds as bytes in a column the target keeps as text (older SQLite rows) is decoded
as UTF-8. New ids continue past the copied ones. The counts are checked before the
transaction commits: a mismatch rolls everything back. The target must be empty but for
the rows its stores seeded as they opened (``seeded``: an id counter, say; replaced by the
source's), and every source table must exist there (a table the target does not know
would be left behind: refused, naming it).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Final

from chalie.store.sql import Connection

BATCH: Final = 1000


class CopyError(RuntimeError):
    """The copy cannot be done, or was not exact; one line, naming the table."""


def copy_store(
    source: Connection, target: Connection, *, seeded: Collection[str] = ()
) -> list[tuple[str, int]]:
    """Copy every table of ``source`` into the empty ``target``; (table, rows) each."""
    tables = sorted(source.tables())
    unknown = [t for t in tables if t not in target.tables()]
    if unknown:
        raise CopyError(f"the target has no table {', '.join(unknown)}: nothing was copied")
    full = [
        t
        for t in tables
        if t not in seeded and target.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
    ]
    if full:
        raise CopyError(f"the target is not empty (table {full[0]} has rows): nothing was copied")
    copied: list[tuple[str, int]] = []
    with target.transaction():
        for table in tables:
            if table in seeded:
                target.execute(f"DELETE FROM {table}")
            copied.append((table, _copy_table(source, target, table)))
        for table, count in copied:
            there = int(target.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            if there != count:
                raise CopyError(f"table {table}: {count} rows read, {there} written: rolled back")
    return copied


def _copy_table(source: Connection, target: Connection, table: str) -> int:
    columns = sorted(source.columns(table) & target.columns(table))
    text = target.text_columns(table)
    decode = [i for i, c in enumerate(columns) if c in text]
    names = ", ".join(columns)
    insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
    rows = source.execute(f"SELECT {names} FROM {table}").fetchall()
    for start in range(0, len(rows), BATCH):
        target.executemany(insert, [_fitted(r, decode) for r in rows[start : start + BATCH]])
    if "id" in columns:
        target.ids_follow(table, "id")
    count = int(source.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    if count != len(rows):
        raise CopyError(f"table {table} changed while it was copied: rolled back")
    return count


def _fitted(row: Sequence[Any], decode: Sequence[int]) -> tuple[Any, ...]:
    values = list(row)
    for i in decode:
        if isinstance(values[i], bytes | memoryview):
            values[i] = bytes(values[i]).decode("utf-8")
    return tuple(values)


__all__ = ["CopyError", "copy_store"]
