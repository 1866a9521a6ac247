"""Examples written by the model: the request, the check of its answer, the cache, the budget.

A tool that arrives without examples (a remote MCP tool) can get a few
user-style requests written by the configured model. Everything here is pure
or a small SQLite table; the scheduling (off every hot path, on the daemon's
event loop) lives in ``actors/example_writer.py``.

Rules, all applied here:

- the model's answer must be a JSON list of strings (a code fence around it is
  tolerated); anything else stores nothing;
- each phrase is one line of at most MAX_PHRASE_CHARS printable characters,
  without a ``[`` at its start (an envelope header), without control
  characters and without instruction-like content; one bad phrase rejects the
  whole answer (a model that writes one hostile line is not trusted for the rest);
- near-identical phrases are kept once; at most MAX_PHRASES, at least MIN_PHRASES;
- answers are cached by the hash of the tool's definition (name, description,
  schema), so a reconnect or a restart asks the model nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

from chalie.discovery.learning import NEAR_IDENTICAL, overlap, word_key
from chalie.discovery.learning import WRITTEN_SOURCE as WRITTEN_SOURCE
from chalie.providers.types import ChatMessage, ModelRequest
from chalie.store.sql import Store
from chalie.store.store_place import Place

MIN_PHRASES: Final = 3
MAX_PHRASES: Final = 10
MAX_PHRASE_CHARS: Final = 160
# The whole answer: past this it is not a list of short phrases.
MAX_ANSWER_CHARS: Final = 8_000
# What of the tool the model is shown (a remote server writes these: bounded).
MAX_DESCRIPTION_CHARS: Final = 2_000
MAX_SCHEMA_CHARS: Final = 4_000
MAX_OUTPUT_TOKENS: Final = 600

SYSTEM_PROMPT: Final = (
    "You write example requests for a tool search index. Given a tool's name, "
    "description and input schema, write 8 short, varied requests a person might "
    "type to an assistant when they need this tool, in plain everyday words, "
    "each under 15 words, without naming the tool. Answer with a JSON list of "
    "strings and nothing else."
)

_FENCE: Final = re.compile(r"^```(?:json)?\s*\n?(?P<body>.*?)\n?```$", re.DOTALL)
# Content that addresses the model or the system instead of asking for something.
_INSTRUCTION: Final = re.compile(
    r"(?i)\b(ignore|disregard|forget)\b.{0,40}\b(instructions?|previous|prior|above|rules?)\b"
    r"|\b(system|developer)\s+(prompt|message)\b"
    r"|\byou\s+(are|must|should|will)\s+(now\s+)?(an?\s+)?(ai|assistant|model|language)\b"
    r"|\b(assistant|system|user)\s*:"
    r"|<\|[^|]*\|>|</?(system|tool|instructions?)>"
    r"|\bcall\s+(the\s+)?tool\b|\bfind_tools\b"
)


class WrittenError(ValueError):
    """The model's answer is not a usable list of example requests; nothing is stored."""


def definition_hash(name: str, description: str, schema: Mapping[str, Any] | None) -> str:
    """The cache key: a digest of what defines the tool to its callers."""
    record = {"name": name, "description": description, "schema": schema or {}}
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def writing_request(name: str, description: str, schema: Mapping[str, Any] | None) -> ModelRequest:
    """The one-message request that asks the model for example requests."""
    schema_text = json.dumps(schema or {}, sort_keys=True, default=str)[:MAX_SCHEMA_CHARS]
    body = (
        f"Tool name: {name[:128]}\n"
        f"Description: {description[:MAX_DESCRIPTION_CHARS]}\n"
        f"Input schema: {schema_text}"
    )
    return ModelRequest(
        system=SYSTEM_PROMPT,
        messages=(ChatMessage(role="user", text=body),),
        max_tokens=MAX_OUTPUT_TOKENS,
    )


def _phrase(value: object, index: int) -> str:
    if not isinstance(value, str):
        raise WrittenError(f"item {index} is not a string")
    if any(not c.isprintable() for c in value):
        raise WrittenError(f"item {index} holds a control character or a line break")
    text = " ".join(value.split())
    if not text:
        raise WrittenError(f"item {index} is empty")
    if len(text) > MAX_PHRASE_CHARS:
        raise WrittenError(f"item {index} is longer than {MAX_PHRASE_CHARS} characters")
    if text.startswith("["):
        raise WrittenError(f"item {index} starts like an envelope header")
    if _INSTRUCTION.search(text):
        raise WrittenError(f"item {index} reads like an instruction, not a request")
    if not word_key(text):
        raise WrittenError(f"item {index} has no words")
    return text


def validate_phrases(answer: object) -> list[str]:
    """The phrases of a model's answer, checked and deduplicated; WrittenError when unusable."""
    if not isinstance(answer, str):
        raise WrittenError("the answer is not text")
    text = answer.strip()
    if len(text) > MAX_ANSWER_CHARS:
        raise WrittenError(f"the answer is longer than {MAX_ANSWER_CHARS} characters")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced["body"].strip()
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):
        raise WrittenError("the answer is not JSON") from None
    if not isinstance(items, list):
        raise WrittenError("the answer is not a JSON list")
    return check_phrases(items)


def check_phrases(items: list[Any]) -> list[str]:
    """The phrases of a decoded answer (or of a cache row), checked and deduplicated."""
    if len(items) > MAX_ANSWER_CHARS:
        raise WrittenError("too many items")
    phrases: list[str] = []
    keys: list[str] = []
    for index, item in enumerate(items):
        phrase = _phrase(item, index)
        key = word_key(phrase)
        if any(k == key or overlap(k, key) >= NEAR_IDENTICAL for k in keys):
            continue
        keys.append(key)
        phrases.append(phrase)
    if len(phrases) < MIN_PHRASES:
        raise WrittenError(f"fewer than {MIN_PHRASES} distinct phrases")
    return phrases[:MAX_PHRASES]


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS discovery_written (
    hash TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    phrases TEXT NOT NULL,
    model TEXT NOT NULL,
    created REAL NOT NULL
);
"""


class WrittenCache(Store):
    """Validated model-written phrases by definition hash, in the store; thread-safe."""

    def __init__(self, db_path: Place) -> None:
        super().__init__(db_path, _SCHEMA)

    def get(self, digest: str) -> list[str] | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT phrases FROM discovery_written WHERE hash = ?", (digest,)
            ).fetchone()
        if row is None:
            return None
        try:
            # re-checked: the table is a file an operator (or anything) may have edited
            return validate_phrases(str(row[0]))
        except WrittenError:
            return None

    def put(self, digest: str, tool: str, phrases: list[str], model: str) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO discovery_written (hash, tool, phrases, model, created) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (hash) DO UPDATE SET tool = excluded.tool, "
                "phrases = excluded.phrases, model = excluded.model, created = excluded.created",
                (digest, tool, json.dumps(phrases), model[:128], time.time()),
            )

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM discovery_written").fetchone()[0])


class Budget:
    """At most ``per_minute`` requests in any sliding minute; not thread-safe (one loop owns it)."""

    def __init__(self, per_minute: int, *, window: float = 60.0) -> None:
        if isinstance(per_minute, bool) or per_minute < 1:
            raise ValueError("per_minute must be at least 1")
        self.per_minute = per_minute
        self.window = window
        self._spent: deque[float] = deque()

    def wait(self, now: float) -> float:
        """Seconds until a request may start (0: now)."""
        while self._spent and now - self._spent[0] >= self.window:
            self._spent.popleft()
        if len(self._spent) < self.per_minute:
            return 0.0
        return self._spent[0] + self.window - now

    def spend(self, now: float) -> None:
        self._spent.append(now)
