"""What one caller may keep stored, and the free space every new message needs.

One rule, checked by the Conversations actor before a message is stored
(:meth:`actors.conversation.conversations.Conversations.submit`):

1. The disk holding the data directory keeps ``conversations.min_free_bytes``
   free: below it every new message is refused (``disk-full``), the owner's
   too, so a full disk never stops the daemon (SQLite cannot even roll back
   on one).
2. An agent token keeps at most ``agent_max_conversations`` conversations and
   ``agent_max_bytes`` bytes of messages, answers and events: a new message is
   taken only if what it will store fits (:data:`COPIES` times its text, which
   is kept as the message, the turn and its event, plus :data:`ANSWER_ROOM` for
   the answer), else it is refused (``quota-exceeded``). The owner has no quota.

A refused message is stored nowhere and starts no turn.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final

from chalie.conversation.requests import ConversationError
from chalie.wire.principals import Principal

# A message's text is stored three times: the message, its turn's row and its event.
COPIES: Final = 3
# Room kept for the answer and the events of the turn the message starts.
ANSWER_ROOM: Final = 16 * 1024


def free_bytes(where: Path) -> int:
    return shutil.disk_usage(where).free


def check_room(
    who: Principal,
    incoming: int,
    new_conversation: bool,
    *,
    usage: Callable[[str], tuple[int, int]],
    free: int,
    min_free: int,
    max_conversations: int,
    max_bytes: int,
) -> None:
    """ConversationError unless ``who`` may store ``incoming`` more bytes now."""
    if free < min_free:
        raise ConversationError(
            "disk-full",
            f"only {free // (1024 * 1024)} MiB are free where Chalie keeps its data (it "
            f"keeps {min_free // (1024 * 1024)} MiB free); no new work is taken until "
            "there is room",
        )
    if who.is_owner:
        return
    conversations, stored = usage(who.id)
    if new_conversation and conversations >= max_conversations:
        raise ConversationError(
            "quota-exceeded",
            f"this token keeps {conversations} conversations, its limit; the owner can "
            "delete some (chalie conversations delete)",
        )
    if stored + incoming * COPIES + ANSWER_ROOM > max_bytes:
        raise ConversationError(
            "quota-exceeded",
            f"this token keeps {stored // 1024} KiB of conversations and may keep "
            f"{max_bytes // 1024} KiB; the owner can delete some (chalie conversations delete)",
        )
