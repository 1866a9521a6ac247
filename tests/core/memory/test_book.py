"""The memory book on a real chalie.db, real HNSW and Tantivy indexes, and the shipped embedder."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from chalie.discovery.embedder import Embedder
from chalie.memory.book import FORGET_GRACE, MemoryBook, MemoryRequestError
from chalie.memory.records import Draft, Memory, Provenance, Recalled
from chalie.memory.store import MemoryStore
from chalie.memory.whose import OWNER

pytestmark = pytest.mark.slow

ME = Provenance(principal=OWNER, conversation_id="c1")
AGENT = Provenance(principal="agent:bot", source="agent", conversation_id="c2")


def texts(hits: list[Recalled] | list[Memory]) -> list[str]:
    return [h.memory.text if isinstance(h, Recalled) else h.text for h in hits]


def test_a_stored_memory_is_recalled_by_meaning_and_by_words(book: MemoryBook) -> None:
    book.store_memory(Draft(text="My sister Anna lives in Lisbon", people=("Anna",)), ME)
    book.store_memory(Draft(text="I am allergic to peanuts"), ME)
    book.store_memory(Draft(text="I prefer aisle seats on long flights", kind="preference"), ME)
    # meaning: no word in common with the memory but "sister"
    assert texts(book.recall([OWNER], query="where is my sister based", k=1)) == [
        "My sister Anna lives in Lisbon"
    ]
    # words: a rare name the embedder knows nothing about
    book.store_memory(Draft(text="The wifi password hint is Zorblax"), ME)
    assert texts(book.recall([OWNER], query="zorblax", k=1)) == [
        "The wifi password hint is Zorblax"
    ]
    assert texts(book.recall([OWNER], query="nut allergy", k=1)) == ["I am allergic to peanuts"]


def test_recall_needs_a_query_or_a_location(book: MemoryBook) -> None:
    with pytest.raises(MemoryRequestError) as err:
        book.recall([OWNER])
    assert err.value.code == "no-query-or-location"
    assert str(err.value) == "recall requires either a query or a location."
    assert err.value.hint == "pass query= to search by topic, or location= to filter by place."


def test_location_time_and_people_filter(book: MemoryBook) -> None:
    book.store_memory(
        Draft(text="Dinner at the harbour", place="Valletta", time="2026-06-02", kind="event"), ME
    )
    book.store_memory(Draft(text="Hiking with Marco", place="Dolomites", time="2026-08-10"), ME)
    book.store_memory(Draft(text="Conference talk in Lisbon", time="2026-09-20", kind="event"), ME)
    assert texts(book.recall([OWNER], location="valletta")) == ["Dinner at the harbour"]
    # a place named only in the text is found too
    assert texts(book.recall([OWNER], location="Lisbon")) == ["Conference talk in Lisbon"]
    summer = book.recall([OWNER], query="trips", since="2026-06-01", until="2026-08-31")
    assert sorted(texts(summer)) == ["Dinner at the harbour", "Hiking with Marco"]
    assert texts(book.recall([OWNER], query="outdoors", people=["marco"])) == ["Hiking with Marco"]
    assert texts(book.recall([OWNER], query="food", kind="event", location="Valletta")) == [
        "Dinner at the harbour"
    ]


def test_a_near_duplicate_is_merged_not_stored_twice(book: MemoryBook) -> None:
    first, merged = book.store_memory(Draft(text="My sister Anna lives in Lisbon"), ME)
    assert not merged
    again, merged = book.store_memory(
        Draft(text="my sister Anna lives in Lisbon.", people=("Anna",), tags=("family",)), ME
    )
    assert merged and again.id == first.id and again.merged == 1
    assert again.people == ("Anna",) and again.tags == ("family",)
    assert book.store.count() == 1
    # a negation is a different memory, however close its vector
    _, merged = book.store_memory(Draft(text="I like coffee"), ME)
    _, merged2 = book.store_memory(Draft(text="I don't like coffee"), ME)
    assert not merged and not merged2
    assert book.store.count() == 3


def test_each_memory_keeps_its_provenance(book: MemoryBook) -> None:
    before = time.time()
    memory, _ = book.store_memory(
        Draft(text="Pay the rent on the first"),
        Provenance(principal=OWNER, conversation_id="conv-9", untrusted=("web_fetch",)),
    )
    stored = book.get(memory.id)
    assert stored is not None
    assert stored.principal == OWNER and stored.conversation_id == "conv-9"
    assert stored.source == "person" and stored.untrusted == ("web_fetch",)
    assert before <= stored.created <= time.time()
    assert stored.shown()["untrusted_source"] == ["web_fetch"]


def test_an_agents_memories_are_kept_apart(book: MemoryBook) -> None:
    book.store_memory(Draft(text="The owner's bank is Banca Rossa"), ME)
    book.store_memory(Draft(text="The build server is called Banca"), AGENT)
    assert texts(book.recall([OWNER], query="banca")) == ["The owner's bank is Banca Rossa"]
    assert texts(book.recall(["agent:bot"], query="banca")) == ["The build server is called Banca"]
    assert texts(book.recall(["agent:other"], query="banca")) == []
    # the same words under two principals are two memories, never merged across
    book.store_memory(Draft(text="The owner's bank is Banca Rossa"), AGENT)
    assert book.store.count() == 3
    # an agent cannot forget or change the owner's memory
    owners = book.recent([OWNER])
    with pytest.raises(MemoryRequestError) as err:
        book.forget(["agent:bot"], owners[0].id)
    assert err.value.code == "memory-not-found"
    # the owner promotes the agent's memory: now it is theirs
    agents = book.recent(["agent:bot"])
    promoted = book.promote(agents[-1].id)
    assert promoted.principal == OWNER
    assert "The build server is called Banca" in texts(book.recall([OWNER], query="build server"))
    assert texts(book.recall(["agent:bot"], query="build server")) != [
        "The build server is called Banca"
    ]


def test_update_and_forget(book: MemoryBook) -> None:
    memory, _ = book.store_memory(Draft(text="My gym is on Elm Street"), ME)
    changed = book.update([OWNER], memory.id, {"text": "My gym moved to Oak Avenue"})
    assert changed.text == "My gym moved to Oak Avenue"
    assert texts(book.recall([OWNER], query="oak avenue", k=1)) == ["My gym moved to Oak Avenue"]
    assert texts(book.recall([OWNER], query="elm street gym")) == ["My gym moved to Oak Avenue"]
    book.forget([OWNER], memory.id)
    assert book.recall([OWNER], query="gym") == []
    assert book.recent([OWNER]) == []


def test_bad_input_is_a_structured_error_and_loses_nothing(book: MemoryBook) -> None:
    book.store_memory(Draft(text="kept"), ME)
    for bad in (
        Draft(text="   "),
        Draft(text="x" * 5000),
        Draft(text="ok", time="next tuesday"),
        Draft(text="ok", people=tuple(f"p{i}" for i in range(40))),
    ):
        with pytest.raises(MemoryRequestError) as err:
            book.store_memory(bad, ME)
        assert err.value.code == "invalid-param"
    # query syntax is data, not syntax
    for hostile in ('text:"x" AND (', "*", "NOT OR AND", "\x00\u2028[end:memory]"):
        book.recall([OWNER], query=hostile)
    assert texts(book.recent([OWNER])) == ["kept"]


def test_the_index_survives_a_restart_and_is_rebuilt_after_a_crash(
    tmp_path: Path, embedder: Embedder
) -> None:
    home = tmp_path / "h"
    store = MemoryStore(home / "chalie.db")
    first = MemoryBook(store, embedder, home / "index")
    first.store_memory(Draft(text="The spare key is under the blue pot"), ME)
    first.close()  # a clean stop saves the graphs with the generation
    second = MemoryBook(MemoryStore(home / "chalie.db"), embedder, home / "index")
    assert texts(second.recall([OWNER], query="spare key")) == [
        "The spare key is under the blue pot"
    ]
    assert second.rebuilt == 0
    # a write after the save, then no clean stop (a kill): the saved index is stale
    second.store_memory(Draft(text="The boiler code is 4471"), ME)
    third = MemoryBook(MemoryStore(home / "chalie.db"), embedder, home / "index")
    assert texts(third.recall([OWNER], query="boiler code", k=1)) == ["The boiler code is 4471"]
    assert third.rebuilt == 1


def test_export_then_import_round_trips(
    tmp_path: Path, book: MemoryBook, embedder: Embedder
) -> None:
    book.store_memory(Draft(text="Anniversary is on 12 May", time="2026-05-12", kind="event"), ME)
    book.store_memory(Draft(text="Agent note", tags=("x",)), AGENT)
    rows = list(book.export())
    other = MemoryBook(MemoryStore(tmp_path / "other.db"), embedder, None)
    result = other.import_rows([*rows, "junk", {"text": ""}, {"text": 5}])
    assert result == {"stored": 2, "merged": 0, "rejected": 3}
    back = {m.text: m for m in other.recent(None)}
    assert back["Anniversary is on 12 May"].time == "2026-05-12"
    assert back["Agent note"].principal == "agent:bot"
    assert back["Agent note"].source == "import"


def test_skill_rules_come_from_linked_memories(book: MemoryBook) -> None:
    aisle, _ = book.store_memory(
        Draft(text="Books aisle seats", kind="preference", skill="plan_a_trip"), ME
    )
    book.store_memory(
        Draft(text="Never flies before 8 am", kind="instruction", skill="plan_a_trip"), ME
    )
    book.store_memory(Draft(text="Unlinked"), ME)
    rules = book.rules([OWNER], ["plan_a_trip", "research"])
    assert sorted(rules["plan_a_trip"]) == ["Books aisle seats", "Never flies before 8 am"]
    assert "research" not in rules
    book.forget([OWNER], aisle.id)
    assert book.rules([OWNER], ["plan_a_trip"]) == {"plan_a_trip": ["Never flies before 8 am"]}


def test_a_stored_memory_is_recallable_when_store_returns(book: MemoryBook) -> None:
    for i in range(30):
        book.store_memory(Draft(text=f"filler memory number {i} about topic {i * 7}"), ME)
    book.store_memory(Draft(text="The cat's vet is Dr Calleja"), ME)
    assert texts(book.recall([OWNER], query="who is the vet", k=1)) == [
        "The cat's vet is Dr Calleja"
    ]


def test_words_are_found_before_and_after_the_keyword_index_commits(book: MemoryBook) -> None:
    memory, _ = book.store_memory(Draft(text="The gate code is Quokka77"), ME)
    index = book.index()
    # found at once, committed or not (the committer runs within a second)
    assert [i for i, _ in index.keyword([OWNER], "quokka77", 5)] == [memory.id]
    assert index.keyword(["agent:bot"], "quokka77", 5) == []
    index.flush()
    assert index.stats()["text_tail"] == 0 and index.stats()["text_docs"] == 1
    assert [i for i, _ in index.keyword([OWNER], "quokka77", 5)] == [memory.id]
    changed = book.update([OWNER], memory.id, {"text": "The gate code is Wombat12"})
    assert index.keyword([OWNER], "quokka77", 5) == []  # the old words are gone at once
    assert [i for i, _ in index.keyword([OWNER], "wombat12", 5)] == [changed.id]
    index.flush()
    assert index.keyword([OWNER], "quokka77", 5) == []
    book.forget([OWNER], memory.id)
    assert index.keyword([OWNER], "wombat12", 5) == []
    index.flush()
    assert index.keyword([OWNER], "wombat12", 5) == [] and index.stats()["text_docs"] == 0


def test_a_new_memory_the_graph_cannot_reach_is_still_recalled(book: MemoryBook) -> None:
    """HNSW is approximate: a new node among near-duplicates may get no links back. The
    newest vectors are also searched exactly, so a just-stored memory is never missed."""
    for i in range(30):
        book.store_memory(Draft(text=f"Note {i}: the boiler was serviced in spring"), ME)
    memory, _ = book.store_memory(Draft(text="The boiler code is 7731 for the engineer"), ME)
    index = book.index()
    index._graphs[OWNER].remove(memory.id)  # as if no search could reach it
    found = [mid for mid, _ in index.semantic([OWNER], book._vector("the boiler code"), 5)]
    assert found[0] == memory.id
    # Forgotten, it leaves the exact search too.
    book.forget([OWNER], memory.id)
    found = [mid for mid, _ in index.semantic([OWNER], book._vector("the boiler code"), 5)]
    assert memory.id not in found
    assert "The boiler code is 7731 for the engineer" not in texts(
        book.recall([OWNER], query="boiler code for the engineer")
    )


def test_the_keyword_search_keeps_principals_apart_with_or_without_its_filter(
    book: MemoryBook,
) -> None:
    mine, _ = book.store_memory(Draft(text="The gate code is Quorvex"), ME)
    book.index().flush()  # into Tantivy (not only the tail)
    index = book.index()
    # Only the owner has memories: the search needs no principal clause, and finds it.
    assert [m for m, _ in index.keyword([OWNER], "quorvex", 5)] == [mine.id]
    theirs, _ = book.store_memory(Draft(text="The agent's gate code is Quorvex too"), AGENT)
    index.flush()
    assert [m for m, _ in index.keyword([OWNER], "quorvex", 5)] == [mine.id]
    assert [m for m, _ in index.keyword(["agent:bot"], "quorvex", 5)] == [theirs.id]
    both = {m for m, _ in index.keyword([OWNER, "agent:bot"], "quorvex", 5)}
    assert both == {mine.id, theirs.id}


def test_a_repeated_text_is_embedded_once(book: MemoryBook) -> None:
    calls: list[int] = []
    embed = book.embedder.embed

    class Counting:
        model_id, dim = book.embedder.model_id, book.embedder.dim

        def embed(self, texts: list[str]) -> object:
            calls.append(len(texts))
            return embed(texts)

    book.embedder = Counting()  # type: ignore[assignment]
    memory, _ = book.store_memory(Draft(text="Parking is on level minus two"), ME)
    assert [h.memory.id for h in book.recall([OWNER], query="Parking is on level minus two")] == [
        memory.id
    ]
    book.recall([OWNER], query="where did I park")
    book.recall([OWNER], query="where did I park")
    assert calls == [1, 1]


@pytest.mark.parametrize("committed", [False, True], ids=["in-the-tail", "in-tantivy"])
def test_the_rare_words_of_a_query_name_their_memories(book: MemoryBook, committed: bool) -> None:
    """The fusion's third list: the memories holding a word that is in at most RARE_DOCS of
    them, and at most 1 % (a code, a name), so that among thousands of look-alikes the one
    with the reference the person quotes is found (bench_memory figure 2 missed 8 of 100
    without it). In a small book no word is rare."""
    target, _ = book.store_memory(Draft(text="The office parcel has tracking code QX77841"), ME)
    other, _ = book.store_memory(Draft(text="The agent's parcel has code QX77841 too"), AGENT)
    assert book.index().rare([OWNER], "the office parcel, code qx77841") == []
    # 300 more memories (stored as rows, as an import would, without the near-duplicate merge)
    places = ["office", "studio", "flat", "garage", "shop", "clinic", "school", "depot"]
    texts = [f"Parcel {i} for the {places[i % 8]} came on a Monday" for i in range(300)]
    for text, vector in zip(texts, book.embedder.embed(texts), strict=True):
        memory = Memory(id=0, principal=OWNER, kind="fact", text=text, created=1.0, updated=1.0)
        mid = book.store.insert(memory, book.embedder.model_id, vector)
        book.index().add([(msgspec.structs.replace(memory, id=mid), vector)])
    index = book.index()
    if committed:
        index.flush()
    assert index.rare([OWNER], "the office parcel, code qx77841") == [target.id]
    assert index.rare(["agent:bot"], "code QX77841") == [other.id]
    # Words in more memories than that are no one's in particular.
    assert index.rare([OWNER], "the parcel for the office") == []
    assert index.rare([OWNER], "") == [] and index.rare([], "qx77841") == []
    book.forget([OWNER], target.id)
    assert index.rare([OWNER], "code qx77841") == []
    assert target.id not in [h.memory.id for h in book.recall([OWNER], query="qx77841")]


# SQLite's write-ahead log only: PostgreSQL checkpoints on its own.
@pytest.mark.parametrize("store_place", ["sqlite"], indirect=True)
def test_a_store_never_checkpoints_the_wal_the_committer_does(book: MemoryBook) -> None:
    import sqlite3

    from chalie.store.sql import SqliteConnection
    from tools.waiting import wait_until

    conn = book.store._conn
    assert isinstance(conn, SqliteConnection)
    assert conn.raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    done: list[int] = []
    index = book.index()
    assert index.after_commit == book.store.checkpoint
    index.after_commit = lambda: (book.store.checkpoint(), done.append(1))  # type: ignore[func-returns-value]
    for i in range(5):
        book.store_memory(Draft(text=f"Locker {i} holds the winter tyres"), ME)
    wait_until(lambda: bool(done), 30, "the committer's checkpoint")
    probe = sqlite3.connect(book.store.place)  # type: ignore[arg-type]
    try:
        busy, log, copied = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        probe.close()
    assert busy == 0 and log == copied  # nothing left in the WAL that was not copied


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clocked(tmp_path: Path, embedder: Embedder) -> Iterator[tuple[MemoryBook, Clock]]:
    clock = Clock()
    b = MemoryBook(
        MemoryStore(tmp_path / "chalie.db"), embedder, tmp_path / "index" / "memory", clock=clock
    )
    yield b, clock
    b.close()
    b.store.close()


def test_a_forgotten_memorys_id_is_never_given_again(
    clocked: tuple[MemoryBook, Clock],
) -> None:
    book, clock = clocked
    first, _ = book.store_memory(Draft(text="I keep the spare key with Anna"), ME)
    last, _ = book.store_memory(Draft(text="My passport expires in 2031"), ME)
    book.forget([OWNER], last.id)
    after, _ = book.store_memory(Draft(text="The boiler was serviced in May"), ME)
    assert after.id == last.id + 1
    # purged for good, and still its id is never given again
    clock.now += FORGET_GRACE + 1
    assert book.purge() == [last.id]
    book.forget([OWNER], after.id)
    clock.now += FORGET_GRACE + 1
    assert book.purge() == [after.id]
    again, _ = book.store_memory(Draft(text="The car is due for its MOT in June"), ME)
    assert again.id == after.id + 1
    assert first.id < last.id


def test_forget_is_restorable_for_a_while_then_leaves_no_trace(
    clocked: tuple[MemoryBook, Clock],
) -> None:
    book, clock = clocked
    kept, _ = book.store_memory(Draft(text="My bank card PIN hint is the old house number"), ME)
    gone = book.forget([OWNER], kept.id)
    assert gone.forgotten is not None
    assert book.recall([OWNER], query="bank card PIN hint") == []
    assert [m.id for m in book.forgotten([OWNER])] == [kept.id]
    assert book.recent([OWNER]) == []
    restored = book.restore([OWNER], kept.id)
    assert restored.id == kept.id and restored.forgotten is None
    assert texts(book.recall([OWNER], query="bank card PIN hint", k=1)) == [kept.text]
    assert book.forgotten([OWNER]) == []
    book.forget([OWNER], kept.id)
    clock.now += FORGET_GRACE - 60
    assert [m.id for m in book.forgotten([OWNER])] == [kept.id]
    clock.now += 120
    # past its grace: not restorable, even if nothing has purged it yet
    with pytest.raises(MemoryRequestError):
        book.restore([OWNER], kept.id)
    assert book.forgotten([OWNER]) == []
    assert book.get(kept.id) is None
    # and nothing of it comes back when the index is rebuilt from the table
    book.close()
    assert book.recall([OWNER], query="bank card PIN hint") == []


def test_merging_never_loses_a_fact(book: MemoryBook) -> None:
    friday, _ = book.store_memory(
        Draft(text="Dinner with Marco on Friday at the Italian place in Sliema"), ME
    )
    saturday, merged = book.store_memory(
        Draft(text="Dinner with Marco on Saturday at the Italian place in Sliema"), ME
    )
    # close in meaning (cosine distance ~0.006) but another fact: both are kept
    assert not merged and saturday.id != friday.id
    assert sorted(texts(book.recall([OWNER], query="dinner with Marco", k=5))) == sorted(
        [friday.text, saturday.text]
    )
    # the same words said again are the same memory
    again, merged = book.store_memory(
        Draft(text="dinner with Marco on Friday, at the Italian place in Sliema!"), ME
    )
    assert merged and again.id == friday.id


def test_a_newer_fact_supersedes_the_older_which_recall_shows_as_past(book: MemoryBook) -> None:
    porto, _ = book.store_memory(Draft(text="I live in Porto"), ME)
    lisbon, _ = book.store_memory(Draft(text="I moved to Lisbon"), ME, supersedes=porto.id)
    hits = {h.memory.id: h.memory for h in book.recall([OWNER], query="where do I live", k=5)}
    assert hits[porto.id].superseded_by == lisbon.id
    assert hits[porto.id].shown()["past"] is True
    assert "past" not in hits[lisbon.id].shown()
    # only one's own memory can be superseded
    with pytest.raises(MemoryRequestError):
        book.store_memory(Draft(text="I live in Faro"), AGENT, supersedes=lisbon.id)


def test_the_keyword_ranking_is_the_same_before_and_after_indexing(
    book: MemoryBook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of stores waits in the in-memory tail for up to a second before Tantivy
    holds it: its memories are ranked by the same BM25 meanwhile, not put first."""
    import random

    from chalie.memory import index as memory_index

    # The test flushes itself: on PostgreSQL under load the burst's 60 stores took longer
    # than the committer's second, and it moved part of the tail (33 of 60 left).
    monkeypatch.setattr(memory_index, "COMMIT_AFTER", 600.0)

    rng = random.Random(4)
    vocabulary = (
        "garden invoice flight dentist piano kitchen passport bike harbour opera ladder "
        "tent camera cello rowing judo oboe lawyer nurse bakery Lisbon Oslo Kyoto Porto"
    ).split()

    def note(i: int) -> Draft:
        words = rng.sample(vocabulary, rng.randint(2, 9))
        return Draft(text=f"Note {i}: " + " ".join(words))

    book.store_many([note(i) for i in range(400)], ME)
    index = book.index()
    index.flush()
    book.store_many([note(400 + i) for i in range(60)], ME)  # the burst: in the tail
    queries = ["garden invoice", "the dentist in Lisbon", "passport flight camera", "piano"]
    before = {q: index.keyword([OWNER], q, 10) for q in queries}
    assert index.stats()["text_tail"] == 60
    index.flush()
    after = {q: index.keyword([OWNER], q, 10) for q in queries}
    assert index.stats()["text_tail"] == 0
    seen = 0
    for q in queries:
        was, now = dict(before[q]), dict(after[q])
        # the same scores in the same places, within what the tail's own words change in
        # the statistics (a tie may fall either way)
        pairs = zip(before[q], after[q], strict=True)
        assert all(abs(b - a) < 0.05 * a for (_, b), (_, a) in pairs), (before[q], after[q])
        for m in (m for m in now if m > 400):  # the burst's memories, scored alike
            seen += 1
            assert m in was and abs(was[m] - now[m]) < 0.05 * now[m], (q, m)
    assert seen >= 3


def test_a_questions_function_words_do_not_rank_short_remarks_first(book: MemoryBook) -> None:
    """ "What did Gina design ..." matched every short remark asking "what did you ..." on its
    function words (BM25 puts short texts first); the keyword side weighs its content words."""
    chat = [
        "Gina: Wow! What did you get?",
        "Gina: What did you do then?",
        "Gina: How did it go for you?",
        "Gina: The dance class ran late again and the studio floor needs new boards",
        "Gina: My online shop sold out of the red jackets this morning",
        "Gina: The bank called about the loan, all good for now",
        "Gina: I am off to the fabric market with my sister on Sunday",
    ]
    book.store_many([Draft(text=t) for t in chat], ME)
    answer, _ = book.store_memory(
        Draft(text="Gina: here is a peek at the space I designed, cosy and inviting for customers"),
        ME,
    )
    index = book.index()
    ranked = [mid for mid, _ in index.keyword([OWNER], "What did Gina design for her store?", 5)]
    assert ranked[0] == answer.id
    # a query made only of function words still searches them
    assert index.keyword([OWNER], "what did you do", 5)


def test_a_stores_twin_check_searches_narrower_and_a_recall_as_wide_as_before(
    book: MemoryBook,
) -> None:
    from chalie.memory.index import EXPANSION_SEARCH, TWIN_EF

    first, _ = book.store_memory(Draft(text="The spare key is under the blue flower pot"), ME)
    graph = book.index()._graphs[OWNER]
    again, merged = book.store_memory(Draft(text="the spare key is under the blue flower pot."), ME)
    assert merged and again.id == first.id  # the twin is found by the narrow search
    assert graph.expansion_search == TWIN_EF
    book.recall([OWNER], query="where is the spare key", k=3)
    assert graph.expansion_search == EXPANSION_SEARCH


def test_a_table_made_by_an_older_version_gains_the_new_columns(tmp_path: Path) -> None:
    """chalie.db from before forget was reversible (no forgotten, superseded_by or
    forgotten_after): opened, its memories read, forgotten with provenance, restored."""
    import sqlite3

    import numpy as np

    from chalie.memory.store import SCHEMA, pack

    old = SCHEMA.replace(
        "    forgotten       REAL,\n    superseded_by   INTEGER,\n"
        "    forgotten_after TEXT NOT NULL DEFAULT '[]'\n",
        "",
    ).replace("    vector          BLOB NOT NULL,\n", "    vector          BLOB NOT NULL\n")
    assert "forgotten" not in old
    db = sqlite3.connect(tmp_path / "chalie.db")
    db.executescript(old)
    db.execute(
        "INSERT INTO memories (principal, kind, text, source, created, updated, model_id, "
        "vector) VALUES ('owner', 'fact', 'I live in Porto', 'person', 1.0, 1.0, 'm', ?)",
        (pack(np.ones(4, dtype=np.float32)),),
    )
    db.commit()
    db.close()
    store = MemoryStore(tmp_path / "chalie.db")
    try:
        (memory,) = store.many([1]).values()
        assert memory.text == "I live in Porto" and memory.forgotten is None
        assert memory.forgotten_after == () and memory.superseded_by is None
        assert store.forget(1, 5.0, ("web_fetch",))
        assert store.forgotten(None, 10)[0].forgotten_after == ("web_fetch",)
        assert store.restore(1) and store.get(1).forgotten_after == ()  # type: ignore[union-attr]
    finally:
        store.close()
