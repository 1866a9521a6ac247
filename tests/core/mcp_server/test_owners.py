"""ConversationOwners on a real SQLite file (and PostgreSQL): first owner wins, answers from
memory once seen; the inbound exchanges kept for the owner."""

from __future__ import annotations

import threading
from pathlib import Path

from chalie.mcp_server.owners import ConversationOwners
from chalie.store.store_place import Place


def test_the_first_owner_wins_and_is_remembered(store_place: Place) -> None:
    db = store_place
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


def test_kept_exchanges_number_in_order_and_are_handed_over_once(store_place: Place) -> None:
    from chalie.gate.approvals import ApprovalStore
    from chalie.mcp_server.exchange import AgentExchange
    from chalie.mcp_server.kept import KeptExchanges

    book = KeptExchanges(store_place)
    said = dict(token_name="t", agent_name="a", project="p", message="hi")
    first = book.keep(AgentExchange(conversation_id="c1", phase="asked", **said))
    second = book.keep(AgentExchange(conversation_id="c1", phase="answered", **said))
    assert 0 < first.kept < second.kept
    book.seen(first.kept)
    assert [e.kept for e in book.backlog()] == [second.kept]  # no permission table: none asked
    assert book.backlog() == []
    ApprovalStore(store_place).close()  # the requests' table, empty: still none
    assert book.backlog() == [] and [k.seen for k in book.recent()] == [True, True]
    book.close()


def test_a_summary_is_replaced_whole(store_place: Place) -> None:
    from chalie.conversation.compaction import Summary, SummaryStore

    store = SummaryStore(store_place)
    assert store.get("c1") is None
    store.put("c1", Summary(3, "three"), 1.0)
    store.put("c1", Summary(7, "seven"), 2.0)
    assert store.get("c1") == Summary(7, "seven")
    store.delete("c1")
    assert store.get("c1") is None
    store.close()
