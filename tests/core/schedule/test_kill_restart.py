"""kill -9 with reminders pending, then a restart: the missed one fires at start, marked late."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chalie.calls.envelope import parse
from chalie.conversation.store import ConversationStore
from chalie.process import control
from chalie.wire.events import BackgroundResult
from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm import FakeModelServer, load_script
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    s = FakeModelServer(
        load_script(json.dumps({"on_user": {"text": "Stretch now, a little late."}}))
    ).start()
    yield s
    s.stop()


@pytest.fixture
def home(server: FakeModelServer) -> Iterator[Path]:
    h = short_home()
    (h / "config.toml").write_text(
        "[mcp_server]\nport = 0\n[chat]\nport = 0\n"
        f'[models.default]\nbase_url = "{server.url}/v1"\nmodel = "scripted"\nretries = 1\n'
    )
    yield h
    shutil.rmtree(h, ignore_errors=True)


def reminders(home: Path, all_: bool = True) -> list[dict[str, object]]:
    reply = control.request(home, "reminders.list", {"all": all_}, timeout=10)
    assert reply.ok, reply
    rows: list[dict[str, object]] = reply.data
    return rows


def test_a_reminder_missed_while_killed_fires_late_at_the_next_start(home: Path) -> None:
    log = home / "daemon.log"
    first = DaemonProcess(home, log).start()
    try:
        # the owner's chat conversation, where the answer is to go
        ConversationStore(home / "chalie.db").create("c-owner", "chat", "ws")
        soon = control.request(
            home, "reminders.add", {"text": "stretch", "kind": "after", "rule": "2s"}, timeout=10
        )
        later = control.request(
            home,
            "reminders.add",
            {"text": "water plants", "kind": "after", "rule": "1d"},
            timeout=10,
        )
        assert soon.ok and later.ok, (soon, later)
        due = float(soon.data["next_fire"])
    finally:
        first.kill()  # SIGKILL with two reminders pending
    wait_until(lambda: time.time() > due + 0.5, 10, "the reminder's time to pass")
    second = DaemonProcess(home, log).start()
    try:

        def fired() -> dict[str, object] | None:
            rows = {r["text"]: r for r in reminders(home)}
            row = rows["stretch"]
            return row if row["state"] == "done" and row["last_answer"] else None

        row = wait_until(fired, 60, "the missed reminder to fire")
        assert row["last_late"] is True and row["fired"] == 1
        pending = reminders(home, all_=False)
        assert [r["text"] for r in pending] == ["water plants"]  # the other one still waits
        store = ConversationStore(home / "chalie.db")

        def delivered() -> list[BackgroundResult]:
            events = store.events("c-owner", 0, 100)
            return [e for e in events if isinstance(e, BackgroundResult)]

        (event,) = wait_until(delivered, 30, "the answer in the owner's chat")
        (env,) = parse(event.envelope)
        assert env.attrs["late"] is True and env.content == "Stretch now, a little late."
    finally:
        second.kill()
