"""What matters, already in the turn: the memories most relevant to a message, and the
standing facts, under a small token budget, ready to go into a request.

:func:`brief` is what the turn calls before it asks the model (the seed's pinned
``memory`` tool stays for more). It reads the book and returns a :class:`Brief`;
it changes nothing. In order:

1. The standing lines: the person's time zone and local time, then their standing
   memories (kind ``preference`` or ``instruction``, and any fact tagged ``name`` or
   saying "my name is"), newest first, at most :data:`STANDING_SHARE` of the budget.
2. The memories most relevant to ``message`` (a recall of up to :data:`RELEVANT`,
   those scoring at least :data:`MIN_SCORE`), best first, while the budget lasts.
   A memory a newer one superseded is left out (it is past); one already a standing
   line is not repeated.
3. Each line names its id, kind, when it happened and its source; a memory stored
   after the conversation had read untrusted content is kept apart, below the fixed
   untrusted warning line (chalie.calls.untrusted), with the tools it came from.

The budget counts rough tokens (:func:`chalie.memory.fusion.tokens`, four characters a
token) of the whole text: the header and the time-zone line (always in it, ~35), every
line break, and the untrusted warning line (~62) when an untrusted memory is shown.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from chalie.calls.untrusted import WARNING_LINE, clean
from chalie.memory.book import MemoryBook, MemoryRequestError
from chalie.memory.fusion import CHARS_PER_TOKEN, tokens
from chalie.memory.records import Memory

BUDGET: Final = 400
STANDING_SHARE: Final = 0.4
STANDING_KINDS: Final = frozenset({"preference", "instruction"})
STANDING_READ: Final = 50
RELEVANT: Final = 10
MIN_SCORE: Final = 0.3
HEADER: Final = (
    "What you remember that may bear on this message (memory; call the memory tool for more):"
)
_NAME: Final = re.compile(r"\bmy name is\b|\bcall me\b", re.IGNORECASE)


class Brief(msgspec.Struct, frozen=True, kw_only=True):
    """``text``: the block for the request (the header and the time-zone line at least);
    ``ids``: the memories in it, in order; ``tokens``: its rough size."""

    text: str
    ids: tuple[int, ...] = ()
    tokens: int = 0


def brief(
    book: MemoryBook,
    principals: Sequence[str],
    message: str,
    *,
    zone: dt.tzinfo,
    zone_name: str,
    now: float,
    budget: int = BUDGET,
) -> Brief:
    """The brief for ``message`` from ``principals``' memories (see the module docstring)."""
    local = dt.datetime.fromtimestamp(now, zone)
    head = [HEADER, f"- time zone: {zone_name} (now {local:%A %d %B %Y, %H:%M})"]
    used = sum(_cost(line) for line in head)
    standing = [m for m in book.recent(principals, STANDING_READ) if _standing(m)]
    chosen: list[Memory] = []
    room = int(budget * STANDING_SHARE)
    warned = False  # the untrusted warning line is counted with the first memory below it

    def cost_of(memory: Memory) -> int:
        cost = _cost(_line(memory))
        return cost + _cost(WARNING_LINE) if memory.untrusted and not warned else cost

    for memory in standing:
        cost = cost_of(memory)
        if cost > room or used + cost > budget:
            break
        chosen.append(memory)
        warned = warned or bool(memory.untrusted)
        room -= cost
        used += cost
    relevant: list[Memory] = []
    if message.strip():
        try:
            hits = book.recall(principals, query=message[:2000], k=RELEVANT, tz=zone)
        except MemoryRequestError:
            hits = []
        seen = {m.id for m in chosen}
        for hit in hits:
            memory = hit.memory
            if hit.score < MIN_SCORE or memory.id in seen or memory.superseded_by is not None:
                continue
            cost = cost_of(memory)
            if used + cost > budget:
                break
            relevant.append(memory)
            warned = warned or bool(memory.untrusted)
            used += cost
    shown = chosen + relevant
    trusted = [_line(m) for m in shown if not m.untrusted]
    marked = [_line(m) for m in shown if m.untrusted]
    lines = head + trusted
    if marked:
        lines += [WARNING_LINE, *marked]
    text = "\n".join(lines)
    ids = tuple(m.id for m in shown if not m.untrusted) + tuple(m.id for m in shown if m.untrusted)
    return Brief(text=text, ids=ids, tokens=tokens(text))


def _cost(line: str) -> int:
    """A line's share of the budget, its line break included and rounded up: the lines'
    costs add up to at least :func:`tokens` of the text they make."""
    return -(-(len(line) + 1) // CHARS_PER_TOKEN)


def _standing(memory: Memory) -> bool:
    if memory.superseded_by is not None:
        return False
    if memory.kind in STANDING_KINDS:
        return True
    return "name" in (t.casefold() for t in memory.tags) or bool(_NAME.search(memory.text))


def _line(memory: Memory) -> str:
    """One memory as a brief shows it: id, kind, when, source, then its text (cleaned)."""
    about = [f"#{memory.id}", memory.kind]
    if memory.time:
        about.append(memory.time)
    about.append(f"from {memory.source}")
    if memory.untrusted:
        about.append("untrusted: " + ", ".join(memory.untrusted))
    text = " ".join(clean(memory.text).split())
    return f"- ({'; '.join(about)}) {text}"


# A turn's brief is small: a small local model reads it in every request of the turn.
TURN_BUDGET: Final = 200


def for_turn(
    desk: Any, context: Any, message: str, zone_name: str, now: float, budget: int = TURN_BUDGET
) -> str:
    """The block a turn puts before the person's message ('' when no memory bears on it).

    ``desk``: the runtime's :class:`chalie.memory.turns.TurnMemory` (None: no memory);
    whose memories are read comes from ``context`` (the turn's principal), as for the tool.
    """
    if desk is None or not message.strip():
        return ""
    try:
        zone: dt.tzinfo = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        zone, zone_name = dt.UTC, "UTC"
    found = brief(
        desk.book,
        desk.readable(context),
        message,
        zone=zone,
        zone_name=zone_name,
        now=now,
        budget=budget,
    )
    return found.text if found.ids else ""
