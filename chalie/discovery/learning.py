"""Learned examples: the find_tools entries that led to a tool's successful use, kept in chalie.db.

Each row is (entry text, tool, channel, time, the tool's definition digest).
The store is the source of truth; the tool index holds the same phrases as
vectors (``DiscoveryEngine.set_learned``) and is brought in line with it.

Rules, all applied here:

- text is redacted like trail parameters (a value after a secret-looking word,
  long token-like strings), whitespace folded and cut to a find_tools entry;
- near-identical text (the same words, or word sets that overlap at least
  NEAR_IDENTICAL) is stored once: a repeat refreshes the row's time;
- at most ``per_tool`` rows a tool: past that, model-written rows go first,
  then the most redundant row (the one closest to another row of that tool),
  the oldest among equals;
- rows whose tool definition changed since are dropped (``drop_changed``), and
  so are the rows of a tool that leaves (``forget_tool``).

The store never leaves the machine: it is a table in the daemon's database.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from chalie.calls.trail import REDACTED, SECRET_KEY
from chalie.discovery.cascade import MAX_ENTRY_CHARS
from chalie.discovery.engine import DiscoveryEngine
from chalie.store.sql import Store
from chalie.store.store_place import Place

DEFAULT_PER_TOOL: Final = 20
MAX_PER_TOOL: Final = 200
NEAR_IDENTICAL: Final = 0.8
# The source (channel column) of rows the model wrote (chalie/discovery/written.py).
WRITTEN_SOURCE: Final = "model"
MAX_TOOL_CHARS: Final = 256
MAX_CHANNEL_CHARS: Final = 64
MAX_DEFINITION_CHARS: Final = 128

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS discovery_examples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT NOT NULL,
    text TEXT NOT NULL,
    words TEXT NOT NULL,
    channel TEXT NOT NULL,
    created REAL NOT NULL,
    definition TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS discovery_examples_tool ON discovery_examples (tool, created);
"""
_WORDS: Final = re.compile(r"[^\W_]+")
_SECRET_VALUE: Final = re.compile(
    rf"(?P<key>{SECRET_KEY.pattern.removeprefix('(?i)')})(?P<sep>\s*(?:is|was|=|:)?\s*)(?P<value>\S+)",
    re.IGNORECASE,
)
# 20+ characters of letters and digits mixed (a key, a token, a session id)
_TOKEN: Final = re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{20,}\b")

Added = Literal["added", "refreshed"]


class ExampleError(ValueError):
    """A learn request the store refuses (bad text, tool or channel)."""


@dataclass(frozen=True)
class Example:
    id: int
    tool: str
    text: str
    channel: str
    created: float
    definition: str


@dataclass(frozen=True)
class LearnOutcome:
    status: Added
    example: Example
    dropped: tuple[int, ...] = ()


def redact_text(text: str) -> str:
    """The entry with secret-looking values replaced by ``[redacted]``."""
    out = _SECRET_VALUE.sub(lambda m: f"{m['key']}{m['sep']}{REDACTED}", text)
    return _TOKEN.sub(REDACTED, out)


def clean_text(text: object) -> str:
    """What is stored for an entry: printable, redacted, one line, cut like a find_tools entry."""
    if not isinstance(text, str):
        raise ExampleError("an example's text must be a string")
    printable = "".join(c if c.isprintable() else " " for c in text)
    folded = " ".join(redact_text(printable).split())
    if len(folded) > MAX_ENTRY_CHARS:
        cut = folded[:MAX_ENTRY_CHARS]
        space = cut.rfind(" ")
        folded = cut[:space] if space > MAX_ENTRY_CHARS // 2 else cut
    if not _WORDS.search(folded):
        raise ExampleError("an example needs at least one word")
    return folded


def word_key(text: str) -> str:
    return " ".join(_WORDS.findall(text.lower()))


def overlap(a: str, b: str) -> float:
    """Jaccard overlap of two word keys' word sets."""
    x, y = set(a.split()), set(b.split())
    return len(x & y) / len(x | y) if x and y else 0.0


def _checked(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise ExampleError(f"{what} must be a non-empty string of at most {limit} characters")
    return value.strip()


class LearnedExamples(Store):
    """The learned-examples table; thread-safe (one connection, one lock)."""

    def __init__(self, db_path: Place, *, per_tool: int = DEFAULT_PER_TOOL) -> None:
        if isinstance(per_tool, bool) or not 1 <= per_tool <= MAX_PER_TOOL:
            raise ValueError(f"per_tool must be within 1..{MAX_PER_TOOL}")
        self.per_tool = per_tool
        super().__init__(db_path, _SCHEMA)

    @staticmethod
    def _row(row: tuple[Any, ...]) -> Example:
        id_, tool, text, channel, created, definition = row
        return Example(
            int(id_), str(tool), str(text), str(channel), float(created), str(definition)
        )

    def add(
        self,
        text: str,
        tool: str,
        channel: str,
        *,
        definition: str = "",
        now: float | None = None,
    ) -> LearnOutcome:
        """Store one example (or refresh its near-identical twin), then bound the tool's rows."""
        stored = clean_text(text)
        tool = _checked(tool, "tool", MAX_TOOL_CHARS)
        channel = _checked(channel, "channel", MAX_CHANNEL_CHARS)
        if not isinstance(definition, str) or len(definition) > MAX_DEFINITION_CHARS:
            raise ExampleError(f"definition must be a string of at most {MAX_DEFINITION_CHARS}")
        key = word_key(stored)
        when = time.time() if now is None else float(now)
        with self._lock, self._conn.transaction():
            rows = self._conn.execute(
                "SELECT id, words FROM discovery_examples WHERE tool = ? ORDER BY created, id",
                (tool,),
            ).fetchall()
            for id_, words in rows:
                if words == key or overlap(words, key) >= NEAR_IDENTICAL:
                    self._conn.execute(
                        "UPDATE discovery_examples SET created = ?, channel = ?, definition = ? "
                        "WHERE id = ?",
                        (when, channel, definition, id_),
                    )
                    return LearnOutcome("refreshed", self._get(int(id_)))
            new_id = int(
                self._conn.execute(
                    "INSERT INTO discovery_examples (tool, text, words, channel, created, "
                    "definition) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                    (tool, stored, key, channel, when, definition),
                ).fetchone()[0]
            )
            dropped = self._bound(tool)
            return LearnOutcome("added", self._get(new_id), tuple(dropped))

    def _get(self, id_: int) -> Example:
        row = self._conn.execute(
            "SELECT id, tool, text, channel, created, definition FROM discovery_examples "
            "WHERE id = ?",
            (id_,),
        ).fetchone()
        return self._row(row)

    def _bound(self, tool: str) -> list[int]:
        """Drop the tool's most redundant rows (oldest first among equals) past per_tool."""
        rows = self._conn.execute(
            "SELECT id, words, created, channel FROM discovery_examples WHERE tool = ? "
            "ORDER BY created, id",
            (tool,),
        ).fetchall()
        dropped: list[int] = []
        while len(rows) > self.per_tool:
            newest = rows[-1][0]

            def redundancy(i: int) -> float:
                return max(
                    (overlap(rows[i][1], rows[j][1]) for j in range(len(rows)) if j != i),
                    default=0.0,
                )

            # the newest row is the one just learned: it stays
            candidates = [i for i in range(len(rows)) if rows[i][0] != newest]
            # model-written rows go before anything learned from real use
            victim = max(
                candidates,
                key=lambda i: (rows[i][3] == WRITTEN_SOURCE, round(redundancy(i), 1), -i),
            )
            dropped.append(int(rows[victim][0]))
            del rows[victim]
        if dropped:
            self._conn.executemany(
                "DELETE FROM discovery_examples WHERE id = ?", [(i,) for i in dropped]
            )
        return dropped

    # -- reading ----------------------------------------------------------
    def examples(self, tool: str | None = None) -> list[Example]:
        with self._lock:
            if tool is None:
                rows = self._conn.execute(
                    "SELECT id, tool, text, channel, created, definition FROM discovery_examples "
                    "ORDER BY tool, created, id"
                ).fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT id, tool, text, channel, created, definition FROM discovery_examples "
                    "WHERE tool = ? ORDER BY created, id",
                    (tool,),
                ).fetchall()
        return [self._row(r) for r in rows]

    def phrases(self) -> dict[str, list[str]]:
        """Tool → its example texts, oldest first: what the index should hold."""
        out: dict[str, list[str]] = {}
        for example in self.examples():
            out.setdefault(example.tool, []).append(example.text)
        return out

    def phrases_of(self, tool: str) -> list[str]:
        return [e.text for e in self.examples(tool)]

    # -- forgetting -------------------------------------------------------
    def forget_tool(self, tool: str) -> int:
        with self._lock, self._conn.transaction():
            cur = self._conn.execute("DELETE FROM discovery_examples WHERE tool = ?", (tool,))
            return int(cur.rowcount)

    def forget_id(self, id_: int) -> Example | None:
        with self._lock, self._conn.transaction():
            row = self._conn.execute(
                "SELECT id, tool, text, channel, created, definition FROM discovery_examples "
                "WHERE id = ?",
                (int(id_),),
            ).fetchone()
            if row is None:
                return None
            self._conn.execute("DELETE FROM discovery_examples WHERE id = ?", (int(id_),))
            return self._row(row)

    def clear(self) -> int:
        with self._lock, self._conn.transaction():
            return int(self._conn.execute("DELETE FROM discovery_examples").rowcount)

    def drop_changed(self, definitions: Mapping[str, str]) -> list[str]:
        """Drop rows learned under another definition of their tool; the tools touched."""
        touched: list[str] = []
        with self._lock, self._conn.transaction():
            for tool, definition in definitions.items():
                cur = self._conn.execute(
                    "DELETE FROM discovery_examples WHERE tool = ? AND definition != '' "
                    "AND definition != ?",
                    (tool, definition),
                )
                if cur.rowcount:
                    touched.append(tool)
        return touched

    def tools(self) -> list[str]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT DISTINCT tool FROM discovery_examples ORDER BY tool"
            ).fetchall()
        return [str(r[0]) for r in rows]


# -- the learning path: store and index together --------------------------------------

Refusal = Literal[
    "learning-off", "channel-not-learning", "unknown-tool", "definition-changed", "invalid"
]


@dataclass(frozen=True)
class LearnResult:
    """What ``Learner.learn`` did: learned (added or refreshed), or why not."""

    learned: bool
    reason: Added | Refusal
    example: Example | None = None
    message: str = ""


class Learner:
    """The one learning path: real turns and ``discovery eval --learn-from`` both go through it.

    Not thread-safe on its own: the DiscoveryActor (or the eval) owns it.
    """

    def __init__(
        self,
        store: LearnedExamples,
        engine: DiscoveryEngine,
        *,
        enabled: bool = True,
        channels: Iterable[str] = ("chat",),
    ) -> None:
        self.store = store
        self.engine = engine
        self.enabled = enabled
        self.channels = frozenset(channels)

    def learn(
        self, entry: str, tool: str, channel: str, *, definition: str | None = None
    ) -> LearnResult:
        """Record that ``entry`` led to a successful call of ``tool``; the index follows at once.

        ``definition`` is the tool's definition digest when find_tools injected it
        (``FindResult.definitions``): an example for a tool that changed since is refused.
        """
        if not self.enabled:
            return LearnResult(False, "learning-off")
        if channel not in self.channels:
            return LearnResult(False, "channel-not-learning")
        current = self.engine.definition(tool)
        if current is None:
            return LearnResult(False, "unknown-tool")
        if definition is not None and definition != current:
            return LearnResult(False, "definition-changed")
        try:
            outcome = self.store.add(entry, tool, channel, definition=current)
        except ExampleError as exc:
            return LearnResult(False, "invalid", message=str(exc))
        self.engine.set_learned(tool, self.store.phrases_of(tool))
        return LearnResult(True, outcome.status, outcome.example)

    def sync(self) -> dict[str, int]:
        """Bring the index in line with the store (after opening, or after offline edits).

        Rows learned under a tool definition that has changed since are dropped first.
        """
        held = self.engine.learned()
        definitions = {
            t: d for t in self.store.tools() if (d := self.engine.definition(t)) is not None
        }
        dropped = self.store.drop_changed(definitions)
        wanted = self.store.phrases()
        changed = 0
        for tool in sorted(set(held) | set(wanted)):
            if self.engine.set_learned(tool, wanted.get(tool, ())):
                changed += 1
        return {"tools_changed": changed, "stale_tools": len(dropped)}

    def write(self, tool: str, phrases: Iterable[str], *, source: str) -> int:
        """Store phrases not learned from use (model-written) as ``source`` rows; how many were new.

        They take the same path as learned ones (deduplicated, bounded, dropped
        when the tool changes or leaves, listed, forgotten and cleared the same way).
        """
        current = self.engine.definition(tool)
        if current is None:
            return 0
        held = [word_key(e.text) for e in self.store.examples(tool)]
        added = 0
        for phrase in phrases:
            try:
                key = word_key(clean_text(phrase))
            except ExampleError:
                continue
            if any(k == key or overlap(k, key) >= NEAR_IDENTICAL for k in held):
                continue  # a row already says it (a learned one keeps its source)
            outcome = self.store.add(phrase, tool, source, definition=current)
            held.append(key)
            added += outcome.status == "added"
        self.engine.set_learned(tool, self.store.phrases_of(tool))
        return added

    def tool_changed(self, tools: Iterable[str]) -> None:
        """Tools whose definition changed or that left: their examples go."""
        for tool in tools:
            if self.store.forget_tool(tool):
                self.engine.set_learned(tool, ())

    def forget(self, target: str | int) -> int:
        """Forget a tool's examples (by name) or one example (by id); how many rows went."""
        if isinstance(target, int):
            example = self.store.forget_id(target)
            if example is None:
                return 0
            self.engine.set_learned(example.tool, self.store.phrases_of(example.tool))
            return 1
        count = self.store.forget_tool(target)
        self.engine.set_learned(target, ())
        return count

    def clear(self) -> int:
        count = self.store.clear()
        for tool in list(self.engine.learned()):
            self.engine.set_learned(tool, ())
        return count
