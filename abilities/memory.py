"""memory: store, recall, update, forget and list what the person wants Chalie to remember.

Pinned on the chat, subconscious and external_agent channels beside the
meta-tools. As the seed says, memory bypasses the gate as internal: every
action, ``forget`` included, runs on every channel, a channel without a human
included. ``forget`` takes nothing away for good: the memory is set apart,
restorable for 30 days (the Brain's Memory page, ``chalie memory restore``).
Poisoning is handled by provenance, not by a gate or a prompt: a memory stored
in a conversation that had read untrusted content carries those sources, and a
recall or list that shows such a memory is itself untrusted content (the
warning line first, ``untrusted=true``). Whose memories a call touches and which
untrusted sources it had read come from the runtime (``Services.memory``, a
:class:`chalie.memory.turns.TurnMemory`), never from the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from chalie.ability import Ability
from chalie.calls import untrusted
from chalie.memory import when
from chalie.memory.fusion import within_budget
from chalie.memory.records import Draft, Kind, Memory, Names, Provenance, Text
from chalie.memory.whose import is_agent
from chalie.result import Scalar, ToolResult

if TYPE_CHECKING:
    from chalie.memory.book import MemoryRequestError
    from chalie.memory.turns import TurnMemory

Action = Literal["store", "recall", "update", "forget", "list"]
Short = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class MemoryParams(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Kept short on purpose: this schema is in every first request of three channels."""

    action: Action
    text: Text | None = None
    query: Text | None = None
    # store: where it holds; recall: only memories about this place
    location: Short | None = None
    # store: when it happened (2026-06-02, yesterday); recall: only memories from then
    # (2026-06-02, 2026-06, 2026, 2026-03..2026-05, last week, in March)
    time: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    people: Names | None = None
    kind: Kind | None = None
    # store: the playbook a preference is for (find_skills returns it as a rule)
    skill: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    # update, forget: the memory; store: a memory the new one replaces, kept as past
    # ("moved to Lisbon" after "live in Porto"): no field of its own, for the schema's size
    id: Annotated[int, msgspec.Meta(ge=1)] | None = None


# A recall shows at least DEFAULT_K memories, and up to SHOWN_MOST while the top is flat
# and their texts fit RECALL_BUDGET tokens (chalie.memory.fusion.within_budget).
DEFAULT_K = 5
SHOWN_MOST = 10
RECALL_BUDGET = 400
LIST_LIMIT = 20


def _period(time: str | None, desk: TurnMemory) -> tuple[str | None, str | None]:
    """A recall's ``time`` as (since, until), relative words read in the person's zone."""
    if not time:
        return None, None
    try:
        return when.period(time, desk.now())
    except when.TimeError as exc:
        raise _bad_time(exc) from None


def _happened(time: str | None, desk: TurnMemory) -> str | None:
    """A store's or an update's ``time``: when it happened, in the person's zone."""
    if not time:
        return None
    try:
        return when.happened(time, desk.now())
    except when.TimeError as exc:
        raise _bad_time(exc) from None


def forget_grace() -> float:
    from chalie.memory.book import FORGET_GRACE

    return FORGET_GRACE


def _bad_time(exc: when.TimeError) -> MemoryRequestError:
    from chalie.memory.book import MemoryRequestError

    return MemoryRequestError("invalid-param", str(exc), hint=when.HINT, param="time")


def _shown(
    memories: Sequence[Memory], rows: list[dict[str, Any]], meta: dict[str, Scalar]
) -> ToolResult:
    """What a recall or a list returns: untrusted content (the warning line first) when a
    memory in it was stored after the conversation had read untrusted content."""
    if any(m.untrusted for m in memories):
        return untrusted.success({"memories": rows}, meta=meta)
    return ToolResult.success({"memories": rows}, meta=meta)


def _failed(exc: MemoryRequestError, action: str) -> ToolResult:
    meta: dict[str, str | int | float | bool | None] = {"action": action}
    if exc.param:
        meta["param"] = exc.param
    return ToolResult.error(exc.code, str(exc), hint=exc.hint, meta=meta)


def _unavailable(action: str) -> ToolResult:
    return ToolResult.error(
        "service-unavailable",
        "Memory is not available in this runtime.",
        hint="tell the user memory is unavailable; do not pretend to remember.",
        meta={"action": action},
    )


class MemoryTool(Ability):
    name = "memory"
    # Says what it is not for: the real 1.5B model called it for the time in Tokyo and
    # for exchange rates (22 of 50 calls) when it only said what it holds.
    summary = (
        "Only for facts about the user: store what they ask you to remember; recall what they "
        "ask about themselves (their people, places, preferences, plans). Never for greetings, "
        "general knowledge, time, math, weather, mail or the web."
    )
    tooltip = "Remember and recall"
    examples = (
        "remember that my sister Anna lives in Lisbon",
        "what do you know about my travel preferences",
        "forget what I told you about my old address",
        "what did I do in Valletta last summer",
        "note that I'm allergic to peanuts",
        "list what you remember about me",
    )
    Params = MemoryParams
    actions = {
        "store": ("text",),
        "recall": (),
        "update": ("id",),
        "forget": ("id",),
        "list": (),
    }

    @classmethod
    def implied_action(cls, params: Mapping[str, Any]) -> str | None:
        """A text alone is something to store, a query alone something to recall: what
        the 1.5B model sent, without an action, for "Please remember that my favourite
        colour is green" (in a step that is free text, nothing held it to the schema)."""
        text, query, ident = params.get("text"), params.get("query"), params.get("id")
        if ident is not None:
            return None  # update or forget: not for us to guess
        if text is not None and query is None:
            return "store"
        if query is not None and text is None:
            return "recall"
        return None

    # Memory is infrastructure (the seed: "discovery, memory, reading, the compactors always
    # bypass the gate as internal"), every action: forget too, now that it only sets a
    # memory apart for a while (restorable), so nothing a turn does here is lost for good.
    internal = True
    discoverable = False
    backgroundable = False
    timeout = 30.0

    def _desk(self) -> TurnMemory | None:
        from chalie.memory.turns import TurnMemory

        desk = getattr(self.services, "memory", None)
        return desk if isinstance(desk, TurnMemory) else None

    def run(self, params: MemoryParams) -> ToolResult:
        from chalie.memory.book import MemoryRequestError

        desk = self._desk()
        if desk is None or self.context is None:
            return _unavailable(params.action)
        try:
            return self._run(desk, params)
        except MemoryRequestError as exc:
            return _failed(exc, params.action)

    def _run(self, desk: TurnMemory, p: MemoryParams) -> ToolResult:
        from chalie.memory.book import MemoryRequestError

        assert self.context is not None
        book = desk.book
        readable = desk.readable(self.context)
        if p.action == "recall":
            since, until = _period(p.time, desk)
            hits = book.recall(
                readable,
                # a recall's text has one reading: what to look for (the real model wrote it)
                query=p.query or p.text,
                location=p.location,
                people=p.people or (),
                since=since,
                until=until,
                kind=p.kind,
                k=SHOWN_MOST,
                tz=desk.zone,
            )
            hits = within_budget(hits, DEFAULT_K, RECALL_BUDGET)
            return _shown(
                [h.memory for h in hits],
                [{**h.memory.shown(), "score": h.score} for h in hits],
                {"action": "recall", "count": len(hits)},
            )
        if p.action == "list":
            rows = book.recent(readable, LIST_LIMIT)
            return _shown(rows, [m.shown() for m in rows], {"action": "list", "count": len(rows)})
        principal = desk.principal(self.context)
        if p.action == "store":
            assert p.text is not None
            who = Provenance(
                principal=principal,
                source="agent" if is_agent(principal) else "person",
                conversation_id=self.context.conversation_id,
                untrusted=desk.untrusted_sources(self.context),
            )
            memory, merged = book.store_memory(
                Draft(
                    text=p.text,
                    kind=p.kind or "fact",
                    place=p.location,
                    time=_happened(p.time, desk),
                    people=tuple(p.people or ()),
                    skill=p.skill,
                ),
                who,
                supersedes=p.id,
            )
            return ToolResult.success(
                {"stored": memory.shown(), "merged_with_existing": merged},
                meta={"action": "store", "id": memory.id},
            )
        assert p.id is not None
        if p.action == "forget":
            gone = book.forget((principal,), p.id, after=desk.untrusted_sources(self.context))
            return ToolResult.success(
                {"forgotten": gone.shown(), "restorable_for_days": int(forget_grace() // 86400)},
                meta={"action": "forget", "id": gone.id},
            )
        changes: dict[str, Any] = {
            name: getattr(p, name)
            for name in ("text", "kind", "time", "people", "skill")
            if getattr(p, name) is not None
        }
        if p.location is not None:
            changes["place"] = p.location
        if p.time is not None:
            changes["time"] = _happened(p.time, desk)
        if not changes:
            raise MemoryRequestError(
                "missing-params",
                "update needs at least one field to change.",
                hint="pass text=, kind=, location=, time=, people= or skill=.",
            )
        updated = book.update((principal,), p.id, changes)
        return ToolResult.success(
            {"updated": updated.shown()}, meta={"action": "update", "id": updated.id}
        )
