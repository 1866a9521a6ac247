"""When a background result starts a turn of its own, and what that turn is told.

A result that arrives while its conversation is idle starts a new turn on
the conversation's channel, so the person hears about it (when a turn runs,
the result joins it instead). A result that is already written for the
person (a reminder's answer) is only shown, never announced again.
"""

from __future__ import annotations

from typing import Final

from chalie.wire.events import BackgroundResult

SELF_ANNOUNCED: Final = frozenset({"reminder"})
ORIGIN: Final = "background"


def starts_turn(result: BackgroundResult) -> bool:
    return result.tool not in SELF_ANNOUNCED


FOLLOW_UP_MARK: Final = "[background: "


def follow_up_text(result: BackgroundResult) -> str:
    """The user-role message of the turn a background result starts."""
    outcome = "finished" if result.status == "success" else "failed"
    return (
        f"{FOLLOW_UP_MARK}the {result.tool} call you started earlier has {outcome}; its result "
        "is above.] Tell the person what came of it, briefly."
    )


def is_follow_up(text: str) -> bool:
    """Whether a user-role message is the runtime's follow-up, not anyone's words."""
    return text.startswith(FOLLOW_UP_MARK)


def follow_up_id(result: BackgroundResult) -> str:
    """The turn's client message id: one follow-up per result, however often it is delivered."""
    return f"bg-{result.call_id}"[:128]
