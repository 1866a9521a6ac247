"""What the ``reminder`` ability reaches: the scheduler, behind one small protocol.

The composition root hands an implementation over ``Services.scheduler`` (a
handle on the Scheduler actor); tests may hand any object of this shape.
"""

from __future__ import annotations

from typing import Protocol

from chalie.schedule.rules import RuleKind
from chalie.schedule.store import Reminder


class ReminderError(ValueError):
    """A reminder the scheduler refuses; ``code`` is a stable error code."""

    def __init__(self, code: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.hint = hint


class SchedulerPort(Protocol):
    def add(
        self,
        text: str,
        kind: RuleKind,
        rule: str,
        zone_name: str,
        principal: str,
        conversation_id: str | None,
    ) -> Reminder: ...

    def cancel(self, reminder_id: int, principal: str | None = None) -> bool: ...

    def list(
        self, principal: str | None = None, pending_only: bool = True, limit: int = 100
    ) -> list[Reminder]: ...
