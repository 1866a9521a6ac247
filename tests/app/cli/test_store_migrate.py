"""``chalie store migrate``: a SQLite home copied into a real PostgreSQL, counts checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chalie.calls.trail import Trail
from chalie.conversation.store import Batch, ConversationStore
from chalie.gate.policy import PolicyStore
from chalie.gate.tokens import TokenStore
from chalie.providers.types import ChatMessage
from chalie.schedule.store import ReminderStore
from chalie.store.sql import open_connection
from chalie.store.store_place import Postgres
from chalie_app.cli import cli

pytestmark = pytest.mark.slow


def test_a_sqlite_home_is_copied_into_postgresql_and_reads_back_there(
    tmp_path: Path, pg_cluster: Any
) -> None:
    home, db = tmp_path, tmp_path / "chalie.db"
    tokens = TokenStore(db)
    secret = tokens.create("laptop", scope="owner")
    tokens.create("gone")
    tokens.revoke("gone")
    tokens.close()
    policy = PolicyStore(db)
    policy.set("chat", "email.send", "allow")
    policy.close()
    conversations = ConversationStore(db)
    conversations.create("c1", "chat", title="hello")
    conversations.queue_turn("c1", "t1", "m1", "hi")
    conversations.write(Batch("c1", messages=[(0, "t1", ChatMessage(role="user", text="hi"))]))
    conversations.close()
    trail = Trail(db)
    for i in range(3):
        rec = trail.record_for(
            call_id=f"k{i}", turn_id="t1", conversation_id="c1", channel="chat", tool="clock",
            permission="clock", params="{}", act_summary="",
        )  # fmt: skip
        trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")
    trail.close()
    reminders = ReminderStore(db)
    reminders.add(
        text="stretch", kind="after", rule="PT1H", zone="UTC", principal="owner",
        conversation_id=None, created=0.0, next_fire=3600.0,
    )  # fmt: skip
    reminders.close()
    old = open_connection(db)  # an account row an older version wrote: its spec as bytes
    old.script(
        "CREATE TABLE IF NOT EXISTS accounts (name TEXT PRIMARY KEY, kind TEXT NOT NULL, "
        "spec TEXT NOT NULL, is_default INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL)"
    )
    spec = b'{"name":"home","kind":"ics","url":"https://cal.example/home.ics"}'
    old.execute("INSERT INTO accounts VALUES ('home', 'ics', ?, 1, 1.0)", (spec,))
    old.close()

    url = pg_cluster.new_database()
    (home / "config.toml").write_text(f'[store]\nurl = "{url}"\n')
    runner = CliRunner()
    done = runner.invoke(cli, ["--home", str(home), "store", "migrate", "--json"])
    assert done.exit_code == 0, done.output
    counts = json.loads(done.stdout)
    assert counts["tokens"] == 2 and counts["policy"] == 1 and counts["trail"] == 3
    assert counts["conversations"] == 1 and counts["conversation_messages"] == 1
    assert counts["reminders"] == 1 and counts["accounts"] == 1

    place = Postgres(url)
    there = TokenStore(place)
    assert there.verify(secret) is not None and there.count() == 2
    there.close()
    copied_policy = PolicyStore(place)
    assert copied_policy.table == {("chat", "email.send"): "allow"}
    copied_policy.close()
    moved = ConversationStore(place)
    loaded = moved.load("c1")
    assert loaded is not None and loaded.messages == [ChatMessage(role="user", text="hi")]
    moved.close()
    book = Trail(place)
    assert sorted(r.call_id for r in book.query()) == ["k0", "k1", "k2"]
    assert book.reserve() > max(r.id for r in book.query())  # new ids continue past them
    book.close()
    from chalie.accounts.store import AccountStore

    accounts = AccountStore(place, home)
    assert accounts.get("home").url == "https://cal.example/home.ics"  # type: ignore[union-attr]
    accounts.close()
    later = ReminderStore(place)
    added = later.add(
        text="again", kind="after", rule="PT1H", zone="UTC", principal="owner",
        conversation_id=None, created=0.0, next_fire=3600.0,
    )  # fmt: skip
    assert added.id == 2  # the identity continues past the copied rows
    later.close()

    again = runner.invoke(cli, ["--home", str(home), "store", "migrate"])
    assert again.exit_code == 1 and "has tables already" in again.output


def test_migrate_without_a_store_url_says_so(tmp_path: Path) -> None:
    TokenStore(tmp_path / "chalie.db").close()
    done = CliRunner().invoke(cli, ["--home", str(tmp_path), "store", "migrate"])
    assert done.exit_code == 1 and "[store] url is not set" in done.output
