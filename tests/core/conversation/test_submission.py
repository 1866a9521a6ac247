"""How a message is submitted (``Conversations.submit``'s pure steps) as a table.

No daemon: :mod:`chalie.conversation.submission` over plain values, and its one
answer rule over real futures and a real actor. The daemon-level behaviour is in
test_turns.py (duplicates, queueing, refusals) and test_turn_supervision.py (an
actor that dies with the message in its inbox).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pykka
import pytest

from actors.actor import Actor
from chalie.conversation import submission
from chalie.conversation.requests import ConversationError, SendMessage
from chalie.wire.messages import Accepted
from chalie.wire.principals import LOCAL_OWNER, Principal

AGENT = Principal(scope="agent", id="tok_a", name="a")
OTHER = Principal(scope="agent", id="tok_b", name="b")


def message(text: str = "hello", **kw: Any) -> SendMessage:
    fields: dict[str, Any] = {
        "conversation_id": None,
        "channel": "cli",
        "text": text,
        "client_msg_id": "m1",
    }
    fields.update(kw)
    return SendMessage(**fields)


# -- step 2: where a message goes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "owner_id"),
    [(None, ""), (LOCAL_OWNER, ""), (AGENT, "tok_a")],
)
def test_a_message_without_a_conversation_creates_one_owned_by_its_sender(
    who: Principal | None, owner_id: str
) -> None:
    text = "  plan   my\n\tweek " + "x" * 100
    placement = submission.place(message(text, principal=who), "c_new", None)
    assert placement == submission.Placement(
        "c_new",
        who if who is not None else LOCAL_OWNER,
        True,
        ("plan my week " + "x" * 100)[: submission.TITLE_CHARS],
        owner_id,
    )


@pytest.mark.parametrize(
    ("who", "owner_id"),
    [(None, ""), (None, "tok_a"), (AGENT, "tok_a"), (LOCAL_OWNER, "tok_b")],
)
def test_a_message_into_a_conversation_its_sender_may_see_goes_there(
    who: Principal | None, owner_id: str
) -> None:
    placement = submission.place(message(principal=who), "c_1", ("cli", owner_id))
    assert (placement.new, placement.title, placement.owner_id) == (False, "", owner_id)


@pytest.mark.parametrize(("who", "owner_id"), [(AGENT, ""), (AGENT, "tok_b"), (OTHER, "tok_a")])
def test_another_principals_conversation_is_answered_as_one_that_does_not_exist(
    who: Principal, owner_id: str
) -> None:
    with pytest.raises(ConversationError) as refused:
        submission.place(message(principal=who), "c_1", ("cli", owner_id))
    assert refused.value.code == "unknown-conversation"
    assert str(refused.value) == "no conversation 'c_1'"


def test_a_conversation_stays_on_its_channel() -> None:
    with pytest.raises(ConversationError) as refused:
        submission.place(message(channel="web"), "c_1", ("cli", ""))
    assert refused.value.code == "invalid-message"
    assert str(refused.value) == "conversation c_1 is on channel 'cli', not 'web'"


def test_the_bytes_counted_against_a_quota_are_the_texts_utf8() -> None:
    assert submission.incoming_bytes(message("né\ud800")) == 1 + 2 + 3


# -- steps 4 and 5: the answer ---------------------------------------------------------------


def test_a_seen_client_id_is_answered_at_once_with_the_earlier_turn() -> None:
    out = submission.duplicate("c_1", "t_old")
    assert out.result(timeout=0) == Accepted(
        conversation_id="c_1", turn_id="t_old", queued=False, duplicate=True
    )


def test_the_turn_actors_message_carries_the_turns_options_and_the_one_answer() -> None:
    msg = message(busy="cancel", human_present=True, park_asks=True)
    start, taken = submission.start(msg, "t_1", "m_1", 7)
    assert (start.turn_id, start.client_msg_id, start.text, start.busy, start.send_no) == (
        "t_1",
        "m_1",
        "hello",
        "cancel",
        7,
    )
    assert start.human_present and start.park_asks
    assert start.taken is taken and not taken.done()
    assert submission.decided("c_1", "t_1", True) == Accepted(
        conversation_id="c_1", turn_id="t_1", queued=True, duplicate=False
    )


# -- step 6: exactly one answer ----------------------------------------------------------------

Outcome = str  # "decided" | "failed" | "succeeded"


@pytest.mark.parametrize(
    ("events", "answer"),
    [
        (["decided", "succeeded"], "queued"),  # the usual: decided, then the ask's own end
        (["decided", "failed"], "queued"),  # decided, then the actor failed in the first step
        (["failed"], "error"),  # died with the message in its inbox, or failed first
        (["succeeded"], None),  # (never happens: the actor always decides first)
    ],
)
def test_the_first_word_answers_and_only_a_failure_answers_for_an_undecided_actor(
    events: list[Outcome], answer: str | None
) -> None:
    _, taken = submission.start(message(), "t_1", "m_1", 1)
    for event in events:
        if event == "decided":
            taken.set_result(submission.decided("c_1", "t_1", True))
        else:
            asked: concurrent.futures.Future[bool] = concurrent.futures.Future()
            if event == "failed":
                asked.set_exception(RuntimeError("boom"))
            else:
                asked.set_result(True)
            submission.undecided(taken, _Got(asked))
    if answer is None:
        assert not taken.done()
    elif answer == "queued":
        assert taken.result(timeout=0).queued is True
    else:
        with pytest.raises(RuntimeError, match="boom"):
            taken.result(timeout=0)


class _Got:
    """A completed future read the way a pykka future is (``get``)."""

    def __init__(self, future: concurrent.futures.Future[bool]) -> None:
        self._future = future

    def get(self, *, timeout: float | None = None) -> bool:
        return self._future.result(timeout)


class _Decides(Actor):
    """Decides (queued), then fails in what follows, as a turn's first step might."""

    def on_receive(self, message: Any) -> Any:
        message.taken.set_result(submission.decided("c_1", message.turn_id, True))
        raise RuntimeError("the first step failed")


def _ask(ref: pykka.ActorRef[Any]) -> concurrent.futures.Future[Accepted]:
    start, taken = submission.start(message(), "t_1", "m_1", 1)
    ref.ask(start, block=False).add_done_callback(lambda done: submission.undecided(taken, done))
    return taken


def test_a_turn_actor_that_decided_and_then_failed_answers_its_decision() -> None:
    ref = _Decides.start()
    try:
        assert _ask(ref).result(timeout=10).queued is True
    finally:
        ref.stop()


def test_a_turn_actor_that_is_gone_answers_with_its_death() -> None:
    ref = _Decides.start()
    ref.stop()
    with pytest.raises(pykka.ActorDeadError):
        _ask(ref).result(timeout=10)
