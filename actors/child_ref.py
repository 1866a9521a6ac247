"""ChildRef: the typed handle on an actor that survives its restarts, and ChildUnavailable.

Every use resolves the child's current ref, so a restart shows only as a
:class:`ChildUnavailable` for the call in flight; calls name the actor's
methods (``ref.call(PolicyActor.pending)``), so mypy checks them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Concatenate, Final, Generic, ParamSpec, TypeVar

import pykka

from actors.future import CallbackFuture
from chalie.calls.faults import FAULTS
from chalie.result import ToolResult

A = TypeVar("A", bound=pykka.Actor)
P = ParamSpec("P")
R = TypeVar("R")

# How long a ChildRef.call waits for the actor's answer unless told otherwise.
DEFAULT_CALL_TIMEOUT: Final = 30.0


class ChildUnavailable(RuntimeError):
    """A supervised child could not take the call: it is restarting, failed, or gone.

    ``code`` is the stable error code to surface; :meth:`result` gives the
    structured ToolResult a caller can hand back to a turn.
    """

    code: Final = "internal-error"

    def __init__(self, child_id: str, reason: str) -> None:
        super().__init__(f"{child_id} is unavailable: {reason}")
        self.child_id = child_id
        self.reason = reason

    def result(self) -> ToolResult:
        return FAULTS.component_restarted(self.child_id)


class ChildRef(Generic[A]):
    """A typed handle on an actor that survives its restarts: the one child-reference type.

    Every use resolves the child's current ref (a restart gives a new one); a
    use that meets a dead or restarting child raises :class:`ChildUnavailable`
    instead of ActorDeadError. Calls name the actor's method itself, so mypy
    checks the arguments and the result type, never a string::

        policy: ChildRef[PolicyActor] = directory.ref("policy", PolicyActor)
        rows = policy.call(PolicyActor.list, include_internal=True)   # list[PolicyRow]
        fut = policy.future(PolicyActor.pending)                      # pykka Future

    :meth:`call` waits at most ``timeout`` seconds (``pykka.Timeout`` after);
    :meth:`within` gives the same handle with another timeout.
    """

    def __init__(
        self,
        resolve: Callable[[], pykka.ActorRef[Any] | None],
        child_id: str,
        kind: type[A],
        *,
        timeout: float | None = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self._resolve = resolve
        self.child_id = child_id
        self.kind = kind
        self.timeout = timeout
        # Building a proxy introspects the actor, so one is kept per incarnation.
        self._proxy: tuple[pykka.ActorRef[Any], Any] | None = None

    @classmethod
    def to(cls, ref: pykka.ActorRef[A], child_id: str | None = None) -> ChildRef[A]:
        """A handle on one fixed actor (an unsupervised one, or in tests)."""
        return ChildRef(lambda: ref, child_id or ref.actor_class.__name__, ref.actor_class)

    def within(self, timeout: float | None) -> ChildRef[A]:
        """The same child, with calls waiting at most ``timeout`` seconds."""
        twin = ChildRef(self._resolve, self.child_id, self.kind, timeout=timeout)
        twin._proxy = self._proxy
        return twin

    def current(self) -> pykka.ActorRef[A]:
        ref = self._resolve()
        if ref is None or not ref.is_alive():
            raise ChildUnavailable(self.child_id, "not running (restarting or stopped)")
        if not issubclass(ref.actor_class, self.kind):
            raise ChildUnavailable(
                self.child_id, f"is a {ref.actor_class.__name__}, not a {self.kind.__name__}"
            )
        return ref

    def is_alive(self) -> bool:
        ref = self._resolve()
        return ref is not None and ref.is_alive()

    def tell(self, message: Any) -> None:
        try:
            self.current().tell(message)
        except pykka.ActorDeadError:
            raise ChildUnavailable(self.child_id, "died before the message arrived") from None

    def ask(self, message: Any, *, timeout: float | None = None) -> Any:
        try:
            return self.current().ask(message, timeout=timeout)
        except pykka.ActorDeadError:
            raise ChildUnavailable(self.child_id, "died during the call") from None

    def future(
        self, method: Callable[Concatenate[A, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> pykka.Future[R]:
        """Call ``method`` on the current actor through its proxy; the pykka future of its value."""
        try:
            ref = self.current()
            cached = self._proxy
            if cached is None or cached[0] is not ref:
                cached = (ref, ref.proxy())
                self._proxy = cached
            found: pykka.Future[R] = getattr(cached[1], method.__name__)(*args, **kwargs)
            return found
        except pykka.ActorDeadError:
            raise ChildUnavailable(self.child_id, "died during the call") from None

    async def acall(
        self, method: Callable[Concatenate[A, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """:meth:`call` for async code: the loop awaits the answer; no thread waits for it.

        Waits at most ``timeout`` seconds (TimeoutError after). The child must be
        an :class:`Actor` (its futures call back).
        """
        fut = self.future(method, *args, **kwargs)
        if not isinstance(fut, CallbackFuture):
            raise TypeError(f"{self.child_id} is not an actors.actor.Actor; use call()")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[R] = loop.create_future()

        def answered(done: CallbackFuture) -> None:  # on the actor's thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_transfer, done, waiter, self.child_id)

        fut.add_done_callback(answered)
        async with asyncio.timeout(self.timeout):
            return await waiter

    def call(
        self, method: Callable[Concatenate[A, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Call ``method`` on the current actor and wait (at most ``timeout``) for its value."""
        fut = self.future(method, *args, **kwargs)
        try:
            return fut.get(timeout=self.timeout)
        except pykka.ActorDeadError:
            raise ChildUnavailable(self.child_id, "died during the call") from None


def _transfer(done: CallbackFuture, waiter: asyncio.Future[Any], child_id: str) -> None:
    """On the loop: hand an actor's answer to the coroutine awaiting it (if it still is)."""
    if waiter.done():
        return
    try:
        waiter.set_result(done.get(timeout=0))
    except pykka.ActorDeadError:
        waiter.set_exception(ChildUnavailable(child_id, "died during the call"))
    except BaseException as exc:
        waiter.set_exception(exc)
