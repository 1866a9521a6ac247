"""Compaction: when a history no longer fits, its oldest turns become a summary the model wrote.

The turn (``actors/conversation/turn.py``) asks :func:`needs_summary` after fitting the
history. When whole turns would be dropped, it asks the model for a summary
of them (:func:`summary_request`) before the step, stores it
(:class:`SummaryStore`: the summary and how many messages it stands for) and
builds every later request with :func:`with_summary`: one note holding the
summary in place of those messages. The messages themselves stay stored;
only the model's view of them is compacted. A newer summary covers the older
one (it is summarised along with the turns after it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from chalie.conversation.act import message_tokens
from chalie.providers.types import ChatMessage, ModelRequest
from chalie.store.sql import Connection, open_connection
from chalie.store.store_place import Place

SUMMARY_HEAD: Final = "[summary of the earlier conversation, written when it grew too long]"
SYSTEM: Final = (
    "Summarise this part of a conversation between a person and their assistant for the "
    "assistant's own later use: who the person is, what they asked, what was decided or "
    "done, facts and preferences they gave, and anything still open. Keep names, numbers, "
    "dates and places exactly. Plain text, at most 200 words."
)
MAX_CHARS: Final = 24_000
MAX_TOKENS: Final = 400


@dataclass(frozen=True)
class Summary:
    upto: int  # how many of the conversation's first messages it stands for
    text: str


def with_summary(
    messages: Sequence[ChatMessage], sizes: Sequence[int], summary: Summary | None
) -> tuple[list[ChatMessage], list[int], int]:
    """(the model's view, its sizes, how many stored messages the view's first one replaces)."""
    if summary is None or not 0 < summary.upto <= len(messages):
        return list(messages), list(sizes), 0
    note = ChatMessage(role="user", text=f"{SUMMARY_HEAD}\n{summary.text}")
    return (
        [note, *messages[summary.upto :]],
        [message_tokens(note), *sizes[summary.upto :]],
        summary.upto - 1,
    )


def transcript(messages: Sequence[ChatMessage]) -> str:
    lines = []
    for m in messages:
        if m.role == "user":
            lines.append(f"Person: {m.text}")
        elif m.role == "assistant":
            calls = ", ".join(c.name for c in m.tool_calls)
            lines.append(f"Assistant: {m.text}" + (f" (called {calls})" if calls else ""))
        elif m.role in ("tool", "background"):
            lines.append(f"Result of {m.tool or 'a tool'}: {m.text[:400]}")
    return "\n".join(lines)[-MAX_CHARS:]


def summary_request(messages: Sequence[ChatMessage]) -> ModelRequest:
    return ModelRequest(
        system=SYSTEM,
        messages=(ChatMessage(role="user", text=transcript(messages)),),
        max_tokens=MAX_TOKENS,
    )


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS conversation_summaries (
    conversation_id TEXT PRIMARY KEY,
    upto            INTEGER NOT NULL,
    text            TEXT NOT NULL,
    created         REAL NOT NULL
)
"""


class SummaryStore:
    """The latest summary of each conversation (one row each), any thread."""

    def __init__(self, db_path: Place) -> None:
        self._conn: Connection = open_connection(db_path)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.script(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def get(self, conversation_id: str) -> Summary | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT upto, text FROM conversation_summaries WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
        return None if row is None else Summary(int(row[0]), str(row[1]))

    def put(self, conversation_id: str, summary: Summary, at: float) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO conversation_summaries (conversation_id, upto, text, created) "
                "VALUES (?, ?, ?, ?) "
                "ON CONFLICT(conversation_id) DO UPDATE SET upto = excluded.upto, "
                "text = excluded.text, created = excluded.created",
                (conversation_id, summary.upto, summary.text, at),
            )

    def delete(self, conversation_id: str) -> None:
        with self._lock:
            self._conn.execute(
                "DELETE FROM conversation_summaries WHERE conversation_id = ?", (conversation_id,)
            )
