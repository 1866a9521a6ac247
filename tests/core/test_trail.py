"""The action trail: rows at start and end, redaction, crash recovery, queries, SIGKILL survival."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import msgspec
import pytest

from chalie.calls.trail import REDACTED, CallRecord, Trail, params_json, redact
from chalie.store.store_place import Place
from tools.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def record(trail: Trail, call_id: str = "c1", **over: object) -> CallRecord:
    fields: dict[str, object] = dict(
        call_id=call_id,
        turn_id="t1",
        conversation_id="conv",
        channel="chat",
        tool="email",
        permission="email.send",
        params='{"to":"bob"}',
        act_summary="sending",
    )
    fields.update(over)
    return trail.record_for(**fields)  # type: ignore[arg-type]


def test_a_call_is_running_at_start_and_complete_at_the_end(store_place: Place) -> None:
    trail = Trail(store_place)
    rec = record(trail)
    trail.start(rec)
    (row,) = trail.query()
    assert (row.status, row.ended_at, row.decision) == ("running", None, None)
    trail.finish(rec, status="error", code="permission-denied", decision="deny", decided_by="human")
    (row,) = trail.query()
    assert (row.call_id, row.turn_id, row.conversation_id, row.channel) == (
        "c1",
        "t1",
        "conv",
        "chat",
    )
    assert (row.tool, row.permission, row.act_summary) == ("email", "email.send", "sending")
    assert (row.status, row.code, row.decision, row.decided_by) == (
        "error",
        "permission-denied",
        "deny",
        "human",
    )
    assert row.ended_at is not None and row.ended_at >= row.started_at
    trail.close()


def test_an_end_written_before_its_start_leaves_one_complete_row(store_place: Place) -> None:
    trail = Trail(store_place)
    rec = record(trail)
    trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")
    trail.start(rec)
    rows = trail.query()
    assert [(r.status, r.decision) for r in rows] == [("success", "allow")]
    trail.close()


def test_the_database_file_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "chalie.db"
    Trail(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_declared_and_secret_looking_parameters_are_redacted() -> None:
    params = {
        "to": "bob",
        "body": "hi",
        "pin": "1234",
        "headers": {"Authorization": "Bearer abc", "accept": "json"},
        "items": [{"api_key": "k", "name": "n"}],
        "password": "hunter2",
    }
    out = redact(params, {"pin"})
    assert out["pin"] == REDACTED and out["password"] == REDACTED
    assert out["headers"] == {"Authorization": REDACTED, "accept": "json"}
    assert out["items"] == [{"api_key": REDACTED, "name": "n"}]
    assert (out["to"], out["body"]) == ("bob", "hi")
    text = params_json(out)
    for secret in ("1234", "hunter2", "Bearer abc", '"k"'):
        assert secret not in text


def test_huge_or_odd_parameters_are_stored_bounded() -> None:
    text = params_json(redact({"blob": "x" * 100_000, "obj": object()}))
    assert len(text) < 20_000
    assert msgspec.json.decode(text)["_truncated"] is True
    deep: dict[str, object] = {}
    node = deep
    for _ in range(100):
        node["d"] = {}
        node = node["d"]  # type: ignore[assignment]
    assert "[too deep]" in params_json(redact(deep))


def test_recover_marks_rows_left_running_as_interrupted(store_place: Place) -> None:
    path = store_place
    trail = Trail(path)
    done, stuck = record(trail, "done"), record(trail, "stuck")
    trail.start(done)
    trail.start(stuck)
    trail.finish(done, status="success", code=None, decision="allow", decided_by="policy")
    trail.close()
    again = Trail(path)
    assert again.recover() == 1
    assert again.recover() == 0
    rows = {r.call_id: r for r in again.query()}
    assert (rows["stuck"].status, rows["stuck"].code) == ("interrupted", "interrupted")
    # Its end is unknown: no duration that would really be the time until the restart.
    assert rows["stuck"].ended_at is None
    assert rows["done"].status == "success"
    # New rows continue after the old ones.
    later = record(again, "later")
    assert later.id > max(r.id for r in rows.values())
    again.close()


def test_queries_filter_and_are_newest_first(store_place: Place) -> None:
    trail = Trail(store_place)
    for i, (tool, channel, status) in enumerate(
        [
            ("email", "chat", "success"),
            ("clock", "subconscious", "error"),
            ("email", "chat", "error"),
        ]
    ):
        rec = record(trail, f"c{i}", tool=tool, channel=channel, conversation_id=f"conv{i % 2}")
        trail.start(rec)
        trail.finish(
            rec,
            status=status,
            code=None if status == "success" else "tool-timeout",  # type: ignore[arg-type]
            decision="allow",
            decided_by="policy",
        )
    assert [r.call_id for r in trail.query()] == ["c2", "c1", "c0"]
    assert [r.call_id for r in trail.query(tool="email")] == ["c2", "c0"]
    assert [r.call_id for r in trail.query(status="error", channel="chat")] == ["c2"]
    assert [r.call_id for r in trail.query(conversation_id="conv1")] == ["c1"]
    assert [r.call_id for r in trail.query(code="tool-timeout", limit=1)] == ["c2"]
    assert trail.query(call_id="c0")[0].tool == "email"
    assert trail.query(since=2**40) == []
    for bad in ({"limit": 0}, {"limit": 10**6}, {"limit": True}, {"status": "weird"}, {"tool": 5}):
        with pytest.raises(ValueError):
            trail.query(**bad)  # type: ignore[arg-type]
    trail.close()


def test_hostile_text_is_stored_verbatim_and_clipped(store_place: Place) -> None:
    trail = Trail(store_place)
    rec = record(
        trail, "x'); DROP TABLE trail; --", tool="../../etc/passwd", act_summary="a" * 5000
    )
    trail.start(rec)
    (row,) = trail.query()
    assert row.call_id == "x'); DROP TABLE trail; --"
    assert row.tool == "../../etc/passwd"
    assert len(row.act_summary) == 512
    trail.close()


def test_concurrent_writers_lose_nothing(store_place: Place) -> None:
    trail = Trail(store_place)

    def work(n: int) -> None:
        for i in range(50):
            rec = record(trail, f"{n}-{i}")
            trail.start(rec)
            trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = trail.query(limit=1000)
    assert len(rows) == 200 and {r.status for r in rows} == {"success"}
    trail.close()


# argv: the place, how many calls, and "right-after" to die (SIGKILL) as the last call is
# replied to, before any settle read the store's answers (its calls are whole rows, ended
# at once as an immediate call's); else a call is left running and stdin awaited.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from chalie.store.store_place import Postgres
    from chalie.calls.trail import Trail

    where, right_after = sys.argv[1], sys.argv[3:] == ["right-after"]
    trail = Trail(Postgres(where) if where.startswith("postgresql://") else Path(where))
    for i in range(int(sys.argv[2])):
        rec = trail.record_for(call_id=f"c{i}", turn_id="t", conversation_id="k", channel="chat",
                               tool="email", permission="email", params="{}", act_summary="")
        if not right_after:
            trail.start(rec)
        trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy",
                     started=not right_after)
        print(f"returned c{i}", flush=True)  # what the dispatcher does next: reply
    if right_after:
        os.kill(os.getpid(), signal.SIGKILL)
    rec = trail.record_for(call_id="in-flight", turn_id="t", conversation_id="k", channel="chat",
                           tool="email", permission="email", params="{}", act_summary="")
    trail.start(rec)
    print("started in-flight", flush=True)
    sys.stdin.read()
    """
)


@pytest.mark.slow
def test_sigkill_between_calls_loses_no_recorded_call(store_place: Place) -> None:
    path = store_place
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), "40"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    returned = []
    for line in proc.stdout:
        if line.startswith("returned "):
            returned.append(line.split()[1])
        if line.startswith("started in-flight"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)  # waits, and closes the pipes
    assert proc.returncode == -signal.SIGKILL
    assert len(returned) == 40

    trail = Trail(path)
    # PostgreSQL ends the killed process's session (and frees its lease) as it reads the
    # closed socket: a moment after the kill, before any restart could come.
    marked: list[int] = []
    wait_until(lambda: marked.append(trail.recover()) or sum(marked), 10, "the dead writer")
    assert sum(marked) == 1
    rows = {r.call_id: r for r in trail.query(limit=1000)}
    assert all(rows[c].status == "success" for c in returned)
    assert rows["in-flight"].status == "interrupted"
    trail.close()


def test_a_deferred_start_and_its_end_become_one_row(store_place: Place) -> None:
    trail = Trail(store_place)
    rec = record(trail)
    trail.defer_start(rec)
    assert trail.query() == []
    trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")
    assert trail.flush_starts() == (0, None)
    assert [(r.status, r.decision) for r in trail.query()] == [("success", "allow")]
    trail.close()


def test_a_flushed_start_is_running_on_disk_until_its_end(store_place: Place) -> None:
    path = store_place
    trail = Trail(path)
    recs = [record(trail, f"c{i}") for i in range(3)]
    for rec in recs:
        trail.defer_start(rec)
    assert trail.flush_starts() == (3, None)
    reader = Trail(path)
    assert {r.status for r in reader.query()} == {"running"}
    trail.finish(recs[0], status="error", code="cancelled", decision="allow", decided_by="policy")
    trail.settle()  # on PostgreSQL the end was sent without waiting: settled, any reader sees it
    assert sorted(r.status for r in reader.query()) == ["error", "running", "running"]
    assert len(reader.query()) == 3
    reader.close()
    trail.close()


def test_an_older_trail_table_gains_the_parent_call_and_principal_columns(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "old.db"
    old = sqlite3.connect(db)
    old.execute(
        "CREATE TABLE trail (id INTEGER PRIMARY KEY, call_id TEXT NOT NULL, turn_id TEXT NOT NULL,"
        " conversation_id TEXT NOT NULL, channel TEXT NOT NULL, tool TEXT NOT NULL, permission"
        " TEXT, decision TEXT, decided_by TEXT, params TEXT NOT NULL DEFAULT '{}', status TEXT NOT"
        " NULL, code TEXT, act_summary TEXT NOT NULL DEFAULT '', background INTEGER NOT NULL"
        " DEFAULT 0, started_at REAL NOT NULL, ended_at REAL)"
    )
    old.execute(
        "INSERT INTO trail (id, call_id, turn_id, conversation_id, channel, tool, status,"
        " started_at) VALUES (1, 'c0', 't', 'k', 'chat', 'clock', 'success', 1.0)"
    )
    old.commit()
    old.close()
    trail = Trail(db)
    try:
        rec = trail.record_for(
            call_id="c1",
            turn_id="t2",
            conversation_id="k2",
            channel="subconscious",
            tool="web_fetch",
            permission="web_fetch",
            params="{}",
            act_summary="",
            parent_call_id="c0",
            principal="tok-7",
        )
        trail.finish(
            rec, status="success", code=None, decision="allow", decided_by="internal", started=False
        )
        assert [r.call_id for r in trail.query(parent_call_id="c0")] == ["c1"]
        assert trail.query(call_id="c0")[0].parent_call_id == ""
        # The old row has no principal; the new one carries its turn's, and filters by it.
        assert trail.query(call_id="c0")[0].principal == ""
        assert [r.call_id for r in trail.query(principal="tok-7")] == ["c1"]
        assert trail.query(principal="someone-else") == []
    finally:
        trail.close()


def test_usage_per_tool_and_per_server_from_the_trail(store_place: Place) -> None:
    """Issue 34: calls, error rate and p50/p95 per tool and per remote server."""
    from chalie.calls.usage import by_server, by_tool, percentile, summarize

    rows = [("clock", "success", d / 1000) for d in range(1, 101)]  # 1..100 ms
    rows += [("_mcp_git_status", "error", 0.5), ("_mcp_git_log", "success", 1.5)]
    rows += [("_mcp_git_log", "running", None)]
    tools = {u.name: u for u in summarize(rows, by_tool)}
    clock = tools["clock"]
    assert (clock.calls, clock.errors, clock.p50_ms, clock.p95_ms) == (100, 0, 50.0, 95.0)
    assert tools["_mcp_git_log"].calls == 2 and tools["_mcp_git_log"].p50_ms == 1500.0
    (git,) = summarize(rows, by_server)
    assert (git.name, git.calls, git.errors, git.p95_ms) == ("git", 3, 1, 1500.0)
    assert abs(git.error_rate - 1 / 3) < 1e-9
    assert percentile([], 0.5) is None and percentile([7.0], 0.95) == 7.0


def test_two_writers_on_one_store_share_no_id_and_recover_only_a_dead_ones_calls(
    store_place: Place,
) -> None:
    """Two daemons on one store: ids reserved in blocks never collide, and a daemon that
    starts marks interrupted only the calls of a writer that is gone, never a live one's."""
    a, b = Trail(store_place, writer="a"), Trail(store_place, writer="b")
    ids: list[int] = []

    def work(trail: Trail, name: str) -> None:
        for i in range(300):  # past one block each
            rec = record(trail, f"{name}-{i}")
            ids.append(rec.id)
            trail.start(rec)
            trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")

    threads = [threading.Thread(target=work, args=(t, n)) for t, n in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    b.settle()  # its last ends confirmed: every reader sees them (a's query settles a's)
    assert len(set(ids)) == 600 and len(a.query(limit=1000)) == 600
    live, dead = record(a, "live"), record(b, "dead")
    a.start(live)
    b.start(dead)
    b.close()  # its daemon is gone (its connection, and so its lease, ended)
    starting = Trail(store_place, writer="c")
    assert starting.recover_calls() == [("dead", "conv", "email", False)]
    rows = {r.call_id: r.status for r in starting.query(limit=1000)}
    assert (rows["live"], rows["dead"]) == ("running", "interrupted")
    a.finish(live, status="success", code=None, decision="allow", decided_by="policy")
    a.settle()
    assert starting.query(call_id="live")[0].status == "success"
    starting.close()
    a.close()


@pytest.mark.slow
def test_a_call_replied_to_is_recorded_though_the_daemon_dies_right_after(
    store_place: Place,
) -> None:
    """On PostgreSQL an end is sent without waiting for its commit (docs/store.rst, the hot
    path): the server runs what it was sent though the writer died right after replying."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(store_place), "200", "right-after"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    replied = [line.split()[1] for line in done.stdout.splitlines()]
    assert len(replied) == 200
    reader = Trail(store_place)
    wait_until(lambda: len(reader.query(limit=500)) == 200, timeout=10, what="every replied call")
    rows = {r.call_id: r.status for r in reader.query(limit=500)}
    assert rows == dict.fromkeys(replied, "success")
    reader.close()
