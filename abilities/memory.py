"""memory: store, recall, update, forget and list what the person wants Chalie to remember.

Pinned on the chat, subconscious and external_agent channels beside the
meta-tools. ``recall`` and ``list`` are internal (no gate); ``store`` and
``update`` follow the channel's policy; ``forget`` is its own permission
(``memory.forget``, ask by default). Whose memories a call touches and which
untrusted sources it had read come from the runtime (``Services.memory``, a
:class:`chalie.memory.turns.TurnMemory`), never from the arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from chalie.ability import Ability
from chalie.memory.records import Draft, Kind, Names, Provenance, Text
from chalie.memory.whose import is_agent
from chalie.result import ToolResult

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
    # store: when (ISO date); recall: only memories from then (a prefix: 2026-06)
    time: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    people: Names | None = None
    kind: Kind | None = None
    # store: the playbook a preference is for (find_skills returns it as a rule)
    skill: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    id: Annotated[int, msgspec.Meta(ge=1)] | None = None


DEFAULT_K = 5
LIST_LIMIT = 20


def _period(time: str | None) -> tuple[str | None, str | None]:
    """A recall's ``time``: a date or a prefix of one (2026, 2026-06) names a period."""
    if not time:
        return None, None
    return time, time


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
    summary = (
        "Long-term memory about the person: store, recall (query/location), update, forget, list."
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
    # Reading is infrastructure; writing goes through the channel's policy.
    internal_actions = frozenset({"recall", "list"})
    discoverable = False
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
            since, until = _period(p.time)
            hits = book.recall(
                readable,
                query=p.query,
                location=p.location,
                people=p.people or (),
                since=since,
                until=until,
                kind=p.kind,
                k=DEFAULT_K,
            )
            return ToolResult.success(
                {"memories": [{**h.memory.shown(), "score": h.score} for h in hits]},
                meta={"action": "recall", "count": len(hits)},
            )
        if p.action == "list":
            rows = book.recent(readable, LIST_LIMIT)
            return ToolResult.success(
                {"memories": [m.shown() for m in rows]},
                meta={"action": "list", "count": len(rows)},
            )
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
                    time=p.time,
                    people=tuple(p.people or ()),
                    skill=p.skill,
                ),
                who,
            )
            return ToolResult.success(
                {"stored": memory.shown(), "merged_with_existing": merged},
                meta={"action": "store", "id": memory.id},
            )
        assert p.id is not None
        if p.action == "forget":
            gone = book.forget((principal,), p.id)
            return ToolResult.success(
                {"forgotten": gone.shown()}, meta={"action": "forget", "id": gone.id}
            )
        changes: dict[str, Any] = {
            name: getattr(p, name)
            for name in ("text", "kind", "time", "people", "skill")
            if getattr(p, name) is not None
        }
        if p.location is not None:
            changes["place"] = p.location
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
