"""The turn's state machine as a table: ``on(state, message, now) -> (state, effects)``.

No actor, loop, store or model: each test feeds messages to
:func:`chalie.conversation.turn.on` and reads the effects it returns (what the
TurnActor would carry out). The daemon-level behaviour of the same rules is in
test_turns.py, test_sloppy.py, test_compaction.py and test_small_model_aids.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from msgspec.structs import replace as replace_struct

from chalie.conversation import act, answers
from chalie.conversation import turn as core
from chalie.conversation.channels import SHIPPED, Channel
from chalie.process.config import ModelConfig
from chalie.providers.types import ChatMessage, ModelResponse, ProviderError, ToolCallPart, Usage
from chalie.wire.events import (
    BackgroundResult,
    ErrorEvent,
    PermissionRequest,
    PermissionSettled,
    TextDelta,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from chalie.wire.messages import ToolOutcome

T = TypeVar("T")
NOW = core.Now(wall=1_765_000_000.0, mono=1000.0)
BARE = Channel("bare", find_tools=False, pinned=("calculator", "clock"))


class Tools:
    """The catalogue port over a fixed set of names (a descriptor is its name)."""

    def __init__(self, names: tuple[str, ...] = ("calculator", "clock")) -> None:
        self.names = names
        self.injections: dict[str, frozenset[str]] = {}

    def descriptors(self, names: tuple[str, ...], allow_async: bool) -> list[dict[str, Any]]:
        return [{"name": n} for n in names if n in self.names or n.startswith("find_")]

    def injected(self, turn_id: str) -> frozenset[str]:
        return self.injections.get(turn_id, frozenset())

    def scoped(self, channel: str) -> tuple[str, ...]:
        return ()

    def summary(self, tool: str, arguments: dict[str, Any]) -> str:
        return f"run {tool}"


class Machine:
    """A conversation's state and every effect :func:`on` returned, in order."""

    def __init__(
        self,
        channel: Channel = BARE,
        config: ModelConfig | None = None,
        messages: list[ChatMessage] | None = None,
        **settings: Any,
    ) -> None:
        self.state = core.opened(
            "c1",
            channel=channel,
            config=config or ModelConfig(provider="anthropic"),
            tools=Tools(),
            messages=list(messages or []),
            seq=0,
            **settings,
        )
        self.effects: list[core.Effect] = []
        self.now = NOW

    def on(self, message: core.Message) -> list[core.Effect]:
        state, effects = core.on(self.state, message, self.now)
        assert state is self.state
        self.effects.extend(effects)
        return effects

    def start(self, text: str = "hello", turn_id: str = "t1", **fields: Any) -> list[core.Effect]:
        return self.on(
            core.Start(turn_id=turn_id, client_msg_id=f"m-{turn_id}", text=text, **fields)
        )

    def reply(self, text: str = "", *calls: ToolCallPart, tail: str = "") -> list[core.Effect]:
        response = ModelResponse(text=text, tool_calls=calls, usage=Usage(output_tokens=5))
        return self.on(core.Replied(self.state.gen, response, tail))

    def outcome(
        self, slot: int, tool: str, status: str = "success", **fields: Any
    ) -> list[core.Effect]:
        envelope = fields.pop("envelope", f"[{tool}(status={status})]\nok\n[end:{tool}]")
        out = ToolOutcome(call_id=f"k{slot}", tool=tool, status=status, envelope=envelope, **fields)  # type: ignore[arg-type]
        return self.on(core.CallDone(self.state.gen, slot, out))


def of(effects: list[core.Effect], kind: type[T]) -> list[T]:
    return [e for e in effects if isinstance(e, kind)]


def events(effects: list[core.Effect]) -> list[Any]:
    return [ev for p in of(effects, core.Publish) for ev in p.events]


def finished(effects: list[core.Effect]) -> TurnFinished:
    (end,) = [e for e in events(effects) if isinstance(e, TurnFinished)]
    return end


def asked(request_id: str) -> PermissionRequest:
    """A request as the gate makes it: unnumbered, without a turn."""
    return PermissionRequest(
        conversation_id="c1",
        request_id=request_id,
        tool="calculator",
        permission="calculator",
        expires_at=0.0,
    )


def call(name: str = "calculator", i: int = 0, **arguments: Any) -> ToolCallPart:
    return ToolCallPart(id=f"k{i}", name=name, arguments=arguments or {"expression": "1+2"})


# -- the simplest path ---------------------------------------------------------------------


def test_a_start_writes_the_message_arms_the_deadline_and_asks_the_model() -> None:
    m = Machine()
    effects = m.start("what is 1+2")
    kinds = [type(e) for e in effects]
    assert kinds == [core.Taken, core.Write, core.Publish, core.Arm, core.Ask, core.Taken]
    write = of(effects, core.Write)[0].batch
    assert write.turn is not None and write.turn.state == "running"
    assert [(i, t, msg.text) for i, t, msg in write.messages] == [(0, "t1", "what is 1+2")]
    assert [type(e) for e in events(effects)] == [TurnStarted]
    (arm,) = of(effects, core.Arm)
    assert arm.timer == "deadline" and arm.delay == BARE.wall_clock
    (ask,) = of(effects, core.Ask)
    assert ask.names == ("calculator", "clock")
    assert [t["name"] for t in ask.request.tools] == ["calculator", "clock"]
    assert ask.request.messages[-1].text == "what is 1+2"
    assert "Today is" in ask.request.system
    assert of(effects, core.Taken)[0] == core.Taken("t1", False)


def test_an_answer_without_calls_is_stored_and_ends_the_turn_in_one_write() -> None:
    m = Machine()
    m.start()
    effects = m.reply("three", tail=" exactly")
    writes = of(effects, core.Write)
    assert len(writes) == 1
    batch = writes[0].batch
    assert batch.turn is not None and batch.turn.reason == "final" and batch.turn.steps == 1
    assert [msg.role for _, _, msg in batch.messages] == ["assistant"]
    assert [type(e) for e in batch.events] == [TextDelta, TurnFinished]
    assert finished(effects).text == "three"
    assert of(effects, core.Disarm) == [core.Disarm("deadline")]
    (ended,) = of(effects, core.Ended)
    assert ended.reason == "final" and ended.steps == 1
    (arm,) = of(effects, core.Arm)
    assert arm.timer == "idle" and isinstance(arm.message, core.IdleCheck)
    assert m.state.turn is None


def test_a_message_of_an_older_step_or_turn_is_dropped() -> None:
    m = Machine()
    m.start()
    old = m.state.gen
    m.reply("done")
    before = (m.state.seq, len(m.state.messages))
    for stale in (
        core.Delta(old, "late"),
        core.Replied(old, ModelResponse(text="again")),
        core.Deadline(old),
        core.ModelFailed(old, ProviderError("x", "y", retryable=False)),
    ):
        assert m.on(stale) == []
    assert (m.state.seq, len(m.state.messages)) == before


def test_deltas_and_retries_are_stored_and_published_one_by_one() -> None:
    m = Machine()
    m.start()
    effects = m.on(core.Delta(m.state.gen, "thr"))
    assert [type(e) for e in effects] == [core.Write, core.Publish]
    effects = m.on(
        core.Retrying(
            m.state.gen, 2, ProviderError("model-unreachable", "refused", retryable=True), 1.5
        )
    )
    (event,) = events(effects)
    assert isinstance(event, ErrorEvent) and event.code == "model-retry"
    assert event.message == "refused; retrying in 1.5 s (attempt 2)"


def test_a_model_failure_ends_the_turn_saying_why() -> None:
    m = Machine()
    m.start()
    effects = m.on(
        core.ModelFailed(m.state.gen, ProviderError("model-unreachable", "down", retryable=False))
    )
    assert [type(e) for e in events(effects)] == [ErrorEvent, TurnFinished]
    end = finished(effects)
    assert end.reason == "model-error" and end.text == "The model could not answer: down"
    assert core.CancelModel() not in effects  # the request already ended


# -- tool calls, outcomes, repeats, nudges -------------------------------------------------


def test_calls_are_dispatched_at_once_and_their_results_stored_in_call_order() -> None:
    m = Machine()
    m.start()
    effects = m.reply("", call("calculator", 0), call("clock", 1, zone="UTC"))
    dispatched = of(effects, core.Dispatch)
    assert [(d.slot, d.call.tool) for d in dispatched] == [(0, "calculator"), (1, "clock")]
    assert dispatched[0].call.context.turn_id == "t1"
    assert [type(e) for e in events(effects)] == [ToolStarted, ToolStarted]
    # the write comes before the calls leave, the events after
    kinds = [type(e) for e in effects]
    assert kinds.index(core.Write) < kinds.index(core.Dispatch) < kinds.index(core.Publish)
    first = m.outcome(1, "clock")  # out of order
    assert of(first, core.Ask) == []
    assert [type(e) for e in events(first)] == [ToolFinished]
    last = m.outcome(0, "calculator")
    (write,) = of(last, core.Write)
    assert [(msg.role, msg.call_id) for _, _, msg in write.batch.messages] == [
        ("tool", "k0"),
        ("tool", "k1"),
    ]
    (ask,) = of(last, core.Ask)
    assert [msg.role for msg in ask.request.messages] == ["user", "assistant", "tool", "tool"]
    assert m.outcome(0, "calculator") == []  # a second outcome for a call is ignored


def test_a_success_asks_for_the_answer_in_the_results_own_message() -> None:
    channel = replace(BARE, find_tools=True)
    m = Machine(channel, ModelConfig(provider="openai", seed_tools="off"))
    m.start()
    m.reply("", call())
    (ask,) = of(m.outcome(0, "calculator"), core.Ask)
    assert ask.request.messages[-1].text.endswith(answers.ANSWER_NOTE)
    assert ask.check and ask.offered is not None
    # the stored result stays as the tool wrote it
    assert answers.ANSWER_NOTE not in m.state.messages[-1].text


def test_the_same_successful_call_again_gets_its_result_and_no_tools() -> None:
    m = Machine(config=ModelConfig(provider="openai"))
    m.start()
    m.reply("", call())
    m.outcome(0, "calculator")
    effects = m.reply("", call())
    assert of(effects, core.Dispatch) == []
    finished_events = [e for e in events(effects) if isinstance(e, ToolFinished)]
    assert [(e.status, e.code) for e in finished_events] == [("success", "repeated")]
    (ask,) = of(effects, core.Ask)
    assert ask.request.tools == ()  # answer_nudge: the model must answer
    envelope = m.state.messages[-3].text  # the first call's result, as stored
    assert ask.request.messages[-1].text == act.repeated_result(envelope)
    assert "calculator:repeated" in m.state.turn.codes  # type: ignore[union-attr]


def test_the_nth_identical_call_trips_the_repeat_guard_with_the_result_in_hand() -> None:
    m = Machine(channel=replace(BARE, max_repeat=2), config=ModelConfig(provider="anthropic"))
    m.start()
    m.reply("", call())
    m.outcome(0, "calculator", envelope="[calculator(status=success)]\n3\n[end:calculator]")
    effects = m.reply("", call())
    end = finished(effects)
    assert end.reason == "guard-repeat"
    assert "2 times" in end.text and "3" in end.text
    assert of(effects, core.Dispatch) == []


def test_calls_past_the_step_limit_and_malformed_ones_get_error_results() -> None:
    m = Machine(channel=replace(BARE, max_repeat=100))
    m.start()
    broken = ToolCallPart(id="bad", name="calculator", arguments=None, raw="{not json")
    parts = [call("clock", i, zone=str(i)) for i in range(core.MAX_CALLS_PER_STEP + 1)]
    effects = m.reply("", broken, *parts[:-1], parts[-1])
    dispatched = of(effects, core.Dispatch)
    assert len(dispatched) == core.MAX_CALLS_PER_STEP - 1  # slot 0 malformed, the last over
    turn = m.state.turn
    assert turn is not None
    assert turn.calls[0].result == act.malformed_arguments(broken)
    assert turn.calls[-1].result == act.closed_call(
        "clock",
        "overloaded",
        f"Only {core.MAX_CALLS_PER_STEP} tool calls run per step; this one did not.",
    )


def test_an_empty_answer_is_nudged_once_then_the_turn_ends_empty() -> None:
    m = Machine()
    m.start()
    first = m.reply("   ")
    (ask,) = of(first, core.Ask)
    assert ask.request.messages[-1] == ChatMessage(role="user", text=act.EMPTY_NUDGE)
    second = m.reply("")
    end = finished(second)
    assert end.reason == "empty-answer" and end.text == act.EMPTY_LINE
    # the nudge was for one request only: never stored
    assert all(msg.text != act.EMPTY_NUDGE for msg in m.state.messages)


def test_an_unfit_answer_is_refused_with_its_retry_note_where_the_check_is_on() -> None:
    m = Machine(config=ModelConfig(provider="ollama"))
    m.start()
    effects = m.reply("<tools></tools>")
    (ask,) = of(effects, core.Ask)
    assert ask.request.messages[-1].text == answers.retry_note("markup")
    assert "answer refused: markup" in m.state.turn.notes  # type: ignore[union-attr]
    # anthropic: the check is off, the same text is the answer
    other = Machine(config=ModelConfig(provider="anthropic"))
    other.start()
    assert finished(other.reply("<tools></tools>")).reason == "final"


def test_a_find_tools_channel_seeds_find_tools_before_the_first_request() -> None:
    channel = replace(BARE, find_tools=True)
    m = Machine(channel, ModelConfig(provider="openai"))
    effects = m.start("  what   time is it in Tokyo  ")
    assert of(effects, core.Ask) == []
    (seed,) = of(effects, core.Dispatch)
    assert seed.slot == core.SEED and seed.call.tool == "find_tools"
    assert seed.call.arguments == {"query": ["what time is it in Tokyo"]}
    assert seed.call.context.initiator == "framework" and seed.call.context.seed
    m.state.tools.injections["t1"] = frozenset({"clock"})  # type: ignore[attr-defined]
    out = ToolOutcome(call_id=seed.call.call_id, tool="find_tools", status="success", envelope="")
    (ask,) = of(m.on(core.CallDone(m.state.gen, core.SEED, out)), core.Ask)
    assert "clock" in ask.names
    assert "seed:success" in m.state.turn.codes  # type: ignore[union-attr]


def test_a_brief_is_asked_for_then_put_before_the_message_in_the_request_only() -> None:
    channel = replace(BARE, human_present=True)
    m = Machine(channel, ModelConfig(provider="anthropic", memory_brief="on"))
    effects = m.start("plan my day")
    (brief,) = of(effects, core.Brief)
    assert brief.text == "plan my day" and of(effects, core.Ask) == []
    (ask,) = of(m.on(core.Briefed(m.state.gen, "You like mornings.")), core.Ask)
    assert ask.request.messages[-1].text == "You like mornings.\n\nplan my day"
    assert m.state.messages[-1].text == "plan my day"


# -- arrivals mid-turn ---------------------------------------------------------------------


def test_a_background_result_waits_while_a_call_is_out_and_joins_the_next_step() -> None:
    m = Machine()
    m.start()
    m.reply("", call())
    result = BackgroundResult(
        conversation_id="c1", call_id="bg1", tool="clock", status="success", envelope="late"
    )
    result = replace_struct(result, outbox_id=7)
    effects = m.on(core.Background(result))
    (write,) = of(effects, core.Write)
    assert write.batch.messages == []  # no message between a call and its result
    assert of(effects, core.Ack) == [] and len(m.state.held) == 1
    step = m.outcome(0, "calculator")
    roles = [msg.role for msg in of(step, core.Ask)[0].request.messages]
    assert roles[-2:] == ["tool", "background"]
    assert of(step, core.Ack) == [core.Ack([7])]
    # delivered twice (a restart): acknowledged, not stored again
    again = m.on(core.Background(result))
    assert again == [core.Ack([7])]


def test_a_background_result_with_no_turn_is_stored_and_starts_a_follow_up() -> None:
    m = Machine()
    result = BackgroundResult(
        conversation_id="c1", call_id="bg2", tool="research", status="success", envelope="r"
    )
    effects = m.on(core.Background(result))
    assert [msg.role for _, _, msg in of(effects, core.Write)[0].batch.messages] == ["background"]
    assert of(effects, core.FollowUp) == [core.FollowUp(result)]


def test_a_permission_request_is_recorded_and_withdrawn_when_its_turn_ends() -> None:
    m = Machine()
    m.start()
    m.reply("", call())
    request = asked("r1")
    (recorded,) = events(m.on(core.AskHeard(request)))
    assert recorded.turn_id == "t1" and recorded.seq == m.state.seq
    effects = m.on(core.Cancel())
    settled = [e for e in events(effects) if isinstance(e, PermissionSettled)]
    assert [(e.request_id, e.answer) for e in settled] == [("r1", "withdrawn")]
    assert of(effects, core.CancelCalls) == [core.CancelCalls("t1")]
    # the open call gets a result: the history stays valid
    (write,) = of(effects, core.Write)
    assert [msg.role for _, _, msg in write.batch.messages] == ["tool"]
    assert "cancelled" in write.batch.messages[0][2].text
    assert finished(effects).reason == "cancelled"
    assert m.on(core.AskSettled("r1", "allow_once")) == []  # withdrawn with its turn


def test_a_settlement_of_the_turns_request_is_recorded() -> None:
    m = Machine()
    m.start()
    request = asked("r1")
    m.on(core.AskHeard(request))
    (event,) = events(m.on(core.AskSettled("r1", "allow_once")))
    assert isinstance(event, PermissionSettled) and event.answer == "allow_once"


def test_the_deadline_ends_the_turn_and_the_model_request_is_dropped() -> None:
    m = Machine()
    m.start()
    effects = m.on(core.Deadline(m.state.gen))
    assert effects[0] == core.CancelModel()
    assert finished(effects).reason == "guard-time"


def test_the_guards_stop_before_a_step_past_the_step_limit() -> None:
    m = Machine(channel=replace(BARE, max_steps=1, max_repeat=9))
    m.start()
    effects = m.reply("", call())
    assert of(effects, core.Dispatch)
    end = finished(m.outcome(0, "calculator"))
    assert end.reason == "guard-steps"


# -- queueing ------------------------------------------------------------------------------


def test_a_message_during_a_turn_is_queued_and_starts_when_the_turn_ends() -> None:
    m = Machine()
    m.start()
    effects = m.start("second", turn_id="t2")
    assert effects == [core.Taken("t2", True)]
    end = m.reply("first answer")
    assert [t.turn_id for t in of(end, core.Taken)] == ["t2"]
    assert of(end, core.Ask)[0].request.messages[-1].text == "second"
    assert of(end, core.Arm)[-1].timer == "deadline"


def test_a_full_queue_refuses_the_message() -> None:
    m = Machine(max_queued=1)
    m.start()
    m.start("two", turn_id="t2")
    effects = m.start("three", turn_id="t3")
    (write,) = of(effects, core.Write)
    assert write.batch.turn is not None and write.batch.turn.notes == ["queue-full"]
    assert finished(effects).text == core.QUEUE_FULL_LINE
    assert effects[-1] == core.Taken("t3", False)


def test_busy_cancel_ends_the_running_turn_and_starts_the_new_one() -> None:
    m = Machine()
    m.start()
    effects = m.start("instead", turn_id="t2", busy="cancel")
    assert finished(effects).reason == "cancelled"
    assert m.state.turn is not None and m.state.turn.turn_id == "t2"


def test_a_start_for_a_stored_turn_that_already_ran_runs_nothing() -> None:
    m = Machine(queued=[core.Start(turn_id="t1", client_msg_id="m", text="stored")])
    resumed = m.on(core.Resume())
    assert of(resumed, core.Ask)
    m.reply("done")
    assert m.start("stored") == [core.Taken("t1", False)]


def test_idle_is_reported_only_when_nothing_runs_or_waits() -> None:
    m = Machine()
    resumed = m.on(core.Resume())
    (arm,) = of(resumed, core.Arm)
    assert m.on(arm.message) == [core.Idle()]
    m.start()
    assert m.on(core.Evict()) == []


# -- compaction ----------------------------------------------------------------------------


def test_a_history_past_the_window_is_summarised_once_then_the_step_runs() -> None:
    old = [
        ChatMessage(role="user" if i % 2 == 0 else "assistant", text="x" * 400) for i in range(40)
    ]
    config = ModelConfig(provider="anthropic", context_window=2000, max_output_tokens=200)
    m = Machine(config=config, messages=old, summaries=True)
    effects = m.start("now")
    (compact,) = of(effects, core.Compact)
    assert of(effects, core.Ask) == [] and compact.upto > 0
    done = m.on(core.Compacted(m.state.gen, compact.upto, "They talked about x.", 30))
    (keep,) = of(done, core.KeepSummary)
    assert keep.summary.upto == compact.upto and keep.summary.text == "They talked about x."
    (ask,) = of(done, core.Ask)
    assert "They talked about x." in " ".join(msg.text for msg in ask.request.messages)
    assert m.state.turn is not None and m.state.turn.guards.tokens == 30


def test_without_summaries_an_overlong_history_is_only_trimmed() -> None:
    old = [ChatMessage(role="user", text="x" * 400) for _ in range(40)]
    config = ModelConfig(provider="anthropic", context_window=2000, max_output_tokens=200)
    m = Machine(config=config, messages=old)
    effects = m.start("now")
    assert of(effects, core.Compact) == []
    (ask,) = of(effects, core.Ask)
    assert len(ask.request.messages) < 41


def test_the_shipped_chat_channel_offers_its_pins() -> None:
    m = Machine(SHIPPED["chat"], ModelConfig(provider="anthropic"))
    (ask,) = of(m.start(), core.Ask)
    assert ask.names[:3] == ("find_tools", "find_skills", "memory")


def test_a_step_is_free_text_unless_discovery_offered_a_tool_and_no_answer_is_due() -> None:
    # structured steps (chalie.providers.steps) hold a step to a call or an answer only
    # where a tool discovery offered in this turn is in the request
    chat = Channel("chat", human_present=True, pinned=("memory",))
    m = Machine(channel=chat, config=ModelConfig(provider="openai", seed_tools="off"))
    m.state.tools.injections["t1"] = frozenset({"calculator"})  # type: ignore[attr-defined]
    effects = m.start()
    (ask,) = of(effects, core.Ask)
    assert "calculator" in ask.names and ask.request.free is False
    m.reply("", call())
    (ask,) = of(m.outcome(0, "calculator"), core.Ask)
    assert ask.request.free is True  # the answer after a success is asked for in words
    plain = Machine(channel=chat, config=ModelConfig(provider="openai", seed_tools="off"))
    (ask,) = of(plain.start(), core.Ask)
    assert set(ask.names) <= set(chat.tools()) and ask.request.free is True


def test_the_retry_after_a_described_call_or_markup_is_held_to_a_step_object() -> None:
    # Told not to describe a call, the 1.5B model described it again in free text (4 of 4
    # seen); held to a step object it made the call it had described.
    chat = Channel("chat", human_present=True, pinned=("memory",))
    m = Machine(channel=chat, config=ModelConfig(provider="openai", seed_tools="off"))
    (ask,) = of(m.start(), core.Ask)
    assert ask.request.free is True  # only the channel's own tools: free text
    described = "To look that up online, you can use find_tools with the query 'regatta'."
    (retry,) = of(m.reply(described), core.Ask)
    assert retry.request.messages[-1].text == answers.retry_note("described-call")
    assert retry.request.free is False
    # An empty answer's nudge stays free: nothing was described to be made.
    other = Machine(channel=chat, config=ModelConfig(provider="openai", seed_tools="off"))
    other.start()
    (again,) = of(other.reply(""), core.Ask)
    assert again.request.free is True
