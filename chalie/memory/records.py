"""One memory, as stored and as shown: the person's words, where, when, who, and its provenance."""

from __future__ import annotations

from typing import Annotated, Final, Literal, get_args

import msgspec

# What a memory is; each kind is defined once, the tuple derived from it.
Kind = Literal["fact", "preference", "event", "instruction"]
KINDS: Final[tuple[str, ...]] = get_args(Kind)

# Where a memory came from. ``person``: the person said it (chat, CLI);
# ``agent``: an agent principal stored it; ``reflection``: a background pass
# derived it from a conversation; ``import``: ``chalie memory import``.
Source = Literal["person", "agent", "reflection", "import"]
SOURCES: Final[tuple[str, ...]] = get_args(Source)

MAX_TEXT: Final = 2000
MAX_FIELD: Final = 200
MAX_LIST: Final = 16

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT)]
Field = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_FIELD)]
Names = Annotated[list[Field], msgspec.Meta(max_length=MAX_LIST)]


class Memory(msgspec.Struct, frozen=True, kw_only=True):
    """A stored memory. ``untrusted`` names the untrusted sources the storing turn had read."""

    id: int
    principal: str
    kind: Kind
    text: str
    place: str | None = None
    time: str | None = None
    people: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    skill: str | None = None
    source: Source = "person"
    untrusted: tuple[str, ...] = ()
    conversation_id: str | None = None
    created: float = 0.0
    updated: float = 0.0
    merged: int = 0
    # When it was forgotten (None: it is not); a forgotten memory is restorable until purged.
    forgotten: float | None = None
    # The newer memory that replaced this one (it is past, not a second truth).
    superseded_by: int | None = None
    # The untrusted sources the conversation that forgot it had read (a forget is internal:
    # the Brain shows what may have asked for it).
    forgotten_after: tuple[str, ...] = ()

    def shown(self) -> dict[str, object]:
        """The compact form the model and the CLI see (empty fields left out)."""
        out: dict[str, object] = {"id": self.id, "kind": self.kind, "text": self.text}
        for name in ("place", "time", "skill"):
            value = getattr(self, name)
            if value:
                out[name] = value
        if self.people:
            out["people"] = list(self.people)
        if self.tags:
            out["tags"] = list(self.tags)
        if self.untrusted:
            out["untrusted_source"] = list(self.untrusted)
        if self.superseded_by is not None:
            out["past"] = True
            out["superseded_by"] = self.superseded_by
        return out


class Draft(msgspec.Struct, frozen=True, kw_only=True):
    """What a caller asks to store: the fields a person or the model gives."""

    text: str
    kind: Kind = "fact"
    place: str | None = None
    time: str | None = None
    people: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    skill: str | None = None


class Provenance(msgspec.Struct, frozen=True, kw_only=True):
    """Who stores, from which conversation, having read what (set by the runtime, not the model)."""

    principal: str
    source: Source = "person"
    conversation_id: str | None = None
    untrusted: tuple[str, ...] = ()


class Recalled(msgspec.Struct, frozen=True, kw_only=True):
    memory: Memory
    score: float
