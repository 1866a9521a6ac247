"""ConversationOwners on a real SQLite file: first owner wins, answers from memory once seen."""

from __future__ import annotations

import threading
from pathlib import Path

from chalie.mcp_server.owners import ConversationOwners


def test_the_first_owner_wins_and_is_remembered(tmp_path: Path) -> None:
    db = tmp_path / "chalie.db"
    owners = ConversationOwners(db)
    assert owners.owner("c1") is None and owners.known("c1") is None
    owners.record("c1", "agent-a", "a", "p")
    owners.record("c1", "agent-b", "b", "p")  # never handed to another token
    assert owners.owner("c1") == "agent-a" and owners.known("c1") == "agent-a"
    owners.close()

    again = ConversationOwners(db)  # a restart: nothing in memory, the file answers
    assert again.known("c1") is None
    assert again.owner("c1") == "agent-a"
    assert again.known("c1") == "agent-a"
    again.close()


def test_known_never_waits_for_a_write_in_progress(tmp_path: Path) -> None:
    owners = ConversationOwners(tmp_path / "chalie.db")
    owners.record("c1", "agent-a", "a", "p")
    holding = threading.Event()
    release = threading.Event()

    def writer() -> None:
        with owners._lock:  # as a record() waiting on a busy database would
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    assert holding.wait(10)
    assert owners.known("c1") is None  # not blocked: the caller falls back to a read off the loop
    release.set()
    thread.join()
    assert owners.known("c1") == "agent-a"
    owners.close()
