"""Storage and crash recovery (on SQLite and a real PostgreSQL), and the act loop's pure
rules."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from chalie.conversation import act
from chalie.conversation.channels import SHIPPED, Channel, resolve_channels
from chalie.conversation.store import Batch, ConversationStore, TurnUpdate
from chalie.process.config import ChannelConfig
from chalie.providers.types import ChatMessage, ToolCallPart
from chalie.store.store_place import IntegrityError, Place
from chalie.wire.events import (
    BackgroundResult,
    PermissionRequest,
    TextDelta,
    TurnStarted,
    decode_event,
    encode_event,
)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", text=text)


def calls(*ids: str) -> ChatMessage:
    return ChatMessage(
        role="assistant",
        tool_calls=tuple(ToolCallPart(id=i, name="clock", arguments={}) for i in ids),
    )


def result(call_id: str, text: str = "ok") -> ChatMessage:
    return ChatMessage(role="tool", call_id=call_id, tool="clock", text=text)


def test_a_step_is_written_all_or_nothing(store_place: Place) -> None:
    store = ConversationStore(store_place)
    store.create("c1", "chat")
    store.queue_turn("c1", "t1", "m1", "hi")
    good = TurnStarted(
        conversation_id="c1", seq=1, ts=0.0, turn_id="t1", client_msg_id="m1", text="hi"
    )
    store.write(
        Batch(
            "c1",
            messages=[(0, "t1", user("hi"))],
            events=[good],
            turn=TurnUpdate("t1", state="running"),
        )
    )
    clash = TextDelta(conversation_id="c1", seq=1, ts=0.0, turn_id="t1", text="x")  # seq taken
    with pytest.raises(IntegrityError):
        store.write(Batch("c1", messages=[(1, "t1", calls("a"))], events=[clash]))
    loaded = store.load("c1")
    assert loaded is not None and loaded.messages == [user("hi")]  # the failed step left nothing
    assert [e.seq for e in store.events("c1")] == [1]
    store.close()


def test_recovery_answers_open_calls_and_ends_running_turns(store_place: Place) -> None:
    store = ConversationStore(store_place)
    store.create("c1", "chat")
    store.queue_turn("c1", "t1", "m1", "hi")
    store.write(
        Batch(
            "c1",
            messages=[(0, "t1", user("hi")), (1, "t1", calls("a", "b")), (2, "t1", result("a"))],
            events=[
                TurnStarted(
                    conversation_id="c1", seq=1, ts=0.0, turn_id="t1", client_msg_id="m1", text="hi"
                )
            ],
            turn=TurnUpdate("t1", state="running"),
        )
    )
    assert store.interrupted_conversations() == ["c1"]
    events = store.recover("c1")
    assert [(type(e).__name__, e.seq) for e in events] == [("TurnFinished", 2)]
    loaded = store.load("c1")
    assert loaded is not None
    assert [m.role for m in loaded.messages] == ["user", "assistant", "tool", "tool"]
    assert loaded.messages[3].call_id == "b" and "code=interrupted" in loaded.messages[3].text
    assert store.turn("t1").reason == "interrupted"  # type: ignore[union-attr]
    assert store.recover("c1") == [] and store.interrupted_conversations() == []
    store.close()
    again = ConversationStore(store_place)  # reopening keeps everything
    assert [e.seq for e in again.events("c1")] == [1, 2]
    again.close()


def test_a_seen_client_message_id_returns_the_earlier_turn(store_place: Place) -> None:
    store = ConversationStore(store_place)
    store.create("c1", "chat")
    assert store.queue_turn("c1", "t1", "m1", "hi") is None
    seen = store.queue_turn("c1", "t2", "m1", "hi again")
    assert seen is not None and seen.turn_id == "t1"
    assert store.delete("c1") and not store.delete("c1")
    assert store.load("c1") is None and store.events("c1") == []
    store.close()


def test_a_client_id_recorded_between_the_look_up_and_the_insert_answers_that_turn(
    store_place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same message sent twice at once: the second's look-up ran before the first's
    insert. The unique index refuses the second, which answers with the first's turn and
    writes nothing else (the failed block leaves no row)."""
    store = ConversationStore(store_place)
    store.create("c1", "chat")
    assert store.queue_turn("c1", "t1", "m1", "hi") is None
    looked_up = store._turn_of
    calls: list[str] = []

    def late(conversation_id: str, client_msg_id: str) -> object:
        calls.append(client_msg_id)
        return None if len(calls) == 1 else looked_up(conversation_id, client_msg_id)

    monkeypatch.setattr(store, "_turn_of", late)
    again = store.queue_turn("c1", "t2", "m1", "hi")
    assert again is not None and again.turn_id == "t1" and len(calls) == 2
    assert [t.turn_id for t in store.turns("c1")] == ["t1"]
    store.close()


def test_turns_keep_their_order_and_owners_their_conversations(store_place: Place) -> None:
    from chalie.wire.principals import Principal

    store = ConversationStore(store_place)
    agent = Principal(scope="agent", id="tok_a", name="claude")
    store.create("mine", "chat")
    store.create("theirs", "external_agent", principal=agent)
    store.create("boss", "chat", principal=Principal(scope="owner", id="tok_o", name="me"))
    for i in range(5):  # one created time for all: the order is kept all the same
        store.queue_turn("theirs", f"t{i}", f"m{i}", "x" * 10)
    assert [t.turn_id for t in store.turns("theirs")] == [f"t{i}" for i in range(5)]
    assert [t.turn_id for t in store.load("theirs").queued] == [f"t{i}" for i in range(5)]  # type: ignore[union-attr]
    assert store.usage("tok_a") == (1, 50) and store.usage("") == (0, 0)
    assert store.agents_idle_since(float("inf")) == ["theirs"]
    assert store.placement("theirs") == ("external_agent", "tok_a")
    store.close()


def test_a_store_from_before_the_owner_columns_is_filled_in_as_it_opens(
    store_place: Place,
) -> None:
    from chalie.store.sql import open_connection

    old = open_connection(store_place)
    old.script(
        "CREATE TABLE conversations (id TEXT PRIMARY KEY, channel TEXT NOT NULL, "
        "origin TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL, "
        "title TEXT NOT NULL DEFAULT '', principal TEXT NOT NULL DEFAULT '');"
        "CREATE TABLE conversation_turns (turn_id TEXT PRIMARY KEY, conversation_id TEXT NOT "
        "NULL, client_msg_id TEXT NOT NULL, text TEXT NOT NULL, state TEXT NOT NULL, reason "
        "TEXT, created REAL NOT NULL, finished REAL, steps INTEGER NOT NULL DEFAULT 0, tokens "
        "INTEGER NOT NULL DEFAULT 0, notes TEXT NOT NULL DEFAULT '[]', "
        "UNIQUE (conversation_id, client_msg_id))"
    )
    agent = '{"scope":"agent","id":"tok_a","name":"claude"}'
    for cid, owner in (("a", agent), ("o", ""), ("bad", "{not json")):
        old.execute(
            "INSERT INTO conversations (id, channel, created, updated, principal) "
            "VALUES (?, 'chat', 1.0, 1.0, ?)",
            (cid, owner),
        )
    old.close()
    store = ConversationStore(store_place)
    assert store.usage("tok_a") == (1, 0)
    assert store.agents_idle_since(2.0) == ["a"]  # an unreadable owner is the owner's
    store.close()


def test_events_round_trip_through_their_json() -> None:
    event = TextDelta(conversation_id="c", seq=3, ts=1.5, turn_id="t", text="héllo")
    assert decode_event(encode_event(event)) == event


def test_a_request_and_a_result_are_one_type_made_unnumbered_and_recorded_numbered() -> None:
    made = PermissionRequest(
        conversation_id="c", request_id="r", tool="t", permission="t.x", expires_at=9.0
    )
    assert not made.recorded
    recorded = msgspec.structs.replace(made, seq=4, ts=2.0, turn_id="t1")
    assert recorded.recorded and decode_event(encode_event(recorded)) == recorded
    done = BackgroundResult(
        conversation_id="c", call_id="k", tool="t", status="success", envelope="e", outbox_id=7
    )
    assert not done.recorded and decode_event(encode_event(done)) == done


@pytest.mark.parametrize(
    "stored",
    [
        # as the log held them before the two types were merged
        '{"type":"permission_request","conversation_id":"c","seq":5,"ts":1.0,'
        '"request_id":"r","turn_id":"t1","tool":"clock","permission":"clock",'
        '"act_summary":"","params":{},"expires_at":9.0,"asked_by":"","reach":null,"prompt":""}',
        '{"type":"background_result","conversation_id":"c","seq":6,"ts":1.0,'
        '"call_id":"k","tool":"clock","status":"success","envelope":"[clock] ok"}',
    ],
)
def test_events_recorded_by_an_earlier_version_still_read(stored: str) -> None:
    event = decode_event(stored)
    assert event.recorded and event.seq in (5, 6)


def test_context_trimming_shortens_old_results_first_then_drops_old_turns() -> None:
    history = [
        user("old question"),
        calls("a"),
        result("a", "x" * 4000),
        ChatMessage(role="assistant", text="old answer"),
        user("q2"),
        ChatMessage(role="assistant", text="a2"),
        user("current"),
    ]
    full = sum(act.message_tokens(m) for m in history)
    fitted = act.fit_context(history, current_start=6, budget=full - 500)
    assert fitted.messages[2].text == act.DROPPED_RESULT and len(fitted.messages) == 7
    assert fitted.notes == ["context: shortened 1 old tool result(s)"]
    tight = act.fit_context(history, current_start=6, budget=20)
    assert tight.messages[-1] == user("current")
    assert tight.messages[0].role == "user"  # whole turns go: no call loses its result
    assert any("dropped" in n for n in tight.notes)
    assert act.fit_context(history, 6, 10**9).notes == []
    # sizes kept by the caller give the same result, and are not changed by the trimming
    sizes = [act.message_tokens(m) for m in history]
    kept = list(sizes)
    for budget in (full - 500, 20, 10**9):
        assert act.fit_context(history, 6, budget, sizes) == act.fit_context(history, 6, budget)
    assert sizes == kept
    # sizes that do not match the history are ignored, not trusted
    assert act.fit_context(history, 6, full - 500, [1]) == fitted


def test_guards_count_steps_tokens_time_and_repeats() -> None:
    channel = Channel("t", max_steps=2, max_repeat=3, wall_clock=10.0, token_budget=100)
    g = act.Guards(channel, started=0.0)
    assert g.before_step(now=1.0) is None
    g.steps = 2
    assert g.before_step(now=1.0) == "guard-steps"
    g.steps, g.tokens = 0, 100
    assert g.before_step(now=1.0) == "guard-tokens"
    assert g.before_step(now=11.0) == "guard-time"
    call = ToolCallPart(id="1", name="clock", arguments={"b": 1, "a": 2})
    same = ToolCallPart(id="2", name="clock", arguments={"a": 2, "b": 1})
    assert [g.record_call(call), g.record_call(same), g.record_call(call)] == [False, False, True]
    assert "3 times" in g.line("guard-repeat")


def test_operators_override_shipped_channels_and_add_their_own() -> None:
    channels = resolve_channels(
        {
            "chat": ChannelConfig(max_steps=20),
            "research": ChannelConfig(pinned=("calculator",), find_tools=False),
        }
    )
    assert channels["chat"].max_steps == 20 and channels["chat"].human_present
    assert channels["research"].tools() == ("calculator",)
    assert channels["subconscious"] == SHIPPED["subconscious"]
    assert not channels["subconscious"].human_present
    assert channels["web-search"].find_tools is False
    with pytest.raises(ValueError):
        resolve_channels({"Bad Name!": ChannelConfig()})


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        (
            {"models": {"default": {"provider": "x"}}},
            'models.default.provider = "x": must be one of "anthropic", "ollama", "openai"',
        ),
        (
            {"models": {"fast": {"retries": 99}}},
            "models.fast.retries = 99: must be an integer from 0 to 10",
        ),
        ({"models": {"m": {"api_key": "sk-123"}}}, "unknown key 'models.m.api_key'"),
        ({"channels": {"chat": {"max_stepz": 3}}}, "unknown key 'channels.chat.max_stepz'"),
        (
            {"channels": {"c": {"pinned": "calculator"}}},
            'channels.c.pinned = "calculator": must be a list of strings',
        ),
        (
            {"conversations": {"idle_stop": 0}},
            "conversations.idle_stop = 0: must be a number from 0.001 to 86400",
        ),
        ({"models": 5}, "models = 5: must be a table of named tables"),
    ],
)
def test_a_bad_model_channel_or_conversations_key_is_one_line_naming_it(
    raw: dict[str, object], line: str, tmp_path: Path
) -> None:
    from chalie.process.config import Config, ConfigError

    with pytest.raises(ConfigError) as err:
        Config.from_mapping(raw, home=tmp_path)
    assert line in str(err.value) and "\n" not in str(err.value)
