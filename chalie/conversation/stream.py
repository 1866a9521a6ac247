"""A model's text deltas, coalesced on the event loop before they reach the TurnActor.

A streaming model sends a delta per token or two, often several in one TCP
read. Each delta that reaches the TurnActor costs a thread hand-off, a SQLite
transaction and an event to every follower. :class:`DeltaThrottle` passes the
first delta on after :data:`FIRST_WAIT` (too short for a reader to notice; an
answer that arrives whole within it is never a delta of its own), then at most
one joined delta per :data:`DELTA_WINDOW`. When the stream fails or is retried
what is held goes out at once (:meth:`flush`); when it ends, the caller takes
it (:meth:`take`) to store with the answer in one write. Every method runs on
the loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from chalie.conversation import act, answers
from chalie.providers import rescue
from chalie.providers.types import ModelResponse, ProviderError

if TYPE_CHECKING:
    from chalie.conversation.turn import Ask
    from chalie.providers.client import ModelClient

# At most one delta event per window after the first: ~25 a second, below what a
# reader can tell from a per-token stream, and far fewer than a fast model's tokens.
DELTA_WINDOW: Final = 0.04
# The first delta of a model step waits this long for more.
FIRST_WAIT: Final = 0.01


class DeltaThrottle:
    """Joins the deltas that arrive within one window; see the module docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        emit: Callable[[str], None],
        window: float = DELTA_WINDOW,
        first_wait: float = FIRST_WAIT,
    ) -> None:
        self._loop = loop
        self._emit = emit
        self._window = window
        self._first_wait = first_wait
        self._parts: list[str] = []
        self._last = -1.0  # loop time of the last emit (none yet)
        self._timer: asyncio.TimerHandle | None = None

    def add(self, text: str) -> None:
        if not text:
            return
        self._parts.append(text)
        if self._timer is not None:
            return  # a flush is already due
        now = self._loop.time()
        due = now + self._first_wait if self._last < 0 else self._last + self._window
        if now >= due:
            self.flush()
        else:
            self._timer = self._loop.call_at(due, self.flush)

    def flush(self) -> None:
        """Pass on what is held now (the stream failed or is retried)."""
        text = self.take()
        if text:
            self._last = self._loop.time()
            self._emit(text)

    def take(self) -> str:
        """What is held, no longer to be passed on here (the stream ended: it is stored
        with the answer)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        text = "".join(self._parts)
        self._parts.clear()
        return text


async def answer(
    client: ModelClient,
    ask: Ask,
    emit: Callable[[str], None],
    retried: Callable[[int, ProviderError, float], None],
) -> tuple[ModelResponse, str]:
    """One model step of a turn (:class:`chalie.conversation.turn.Ask`), on the loop.

    The text streams to ``emit`` joined per window; a call written as text is held
    back (``ask.offered``) and never shown as an answer, and the answer check holds
    the start of the text until it reads as an answer (``ask.check``). Returns the
    response (the rescued call, if any) and the words not yet passed on, which are
    stored with the answer in one write. A retry (``retried``) streams again from
    the start; what streamed before a failure is passed on before it is raised.
    """
    deltas = DeltaThrottle(asyncio.get_running_loop(), emit)
    held = rescue.HeldText() if ask.offered is not None else None
    checked = answers.HeldAnswer(ask.names) if ask.check else None

    def shown(text: str) -> str:
        return checked.feed(text) if checked is not None and text else text

    def on_delta(text: str) -> None:
        deltas.add(shown(held.feed(text) if held is not None else text))

    def on_retry(attempt: int, error: ProviderError, delay: float) -> None:
        if held is not None:
            held.release()  # the retry streams the answer again from its start
        if checked is not None:
            checked.release()
        deltas.flush()
        retried(attempt, error, delay)

    try:
        response = await client.complete(ask.request, on_delta, on_retry)
    except BaseException:
        deltas.flush()  # what streamed before the failure reaches the actor first
        raise
    if ask.offered is not None and held is not None:
        rescued = act.rescued_response(response, ask.offered)
        if rescued is not None:
            held.release()  # the call is never shown as an answer
            return rescued, deltas.take()
        deltas.add(shown(held.release()))
    if checked is not None:
        deltas.add(checked.release())
    return response, deltas.take()
