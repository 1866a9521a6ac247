"""The actor bases: :class:`Actor` (our pykka threading actor) and :class:`SupervisedActor`.

A ``SupervisedActor`` constructed while a supervisor starts it (inside
:func:`binding`) binds itself to that supervisor and child id, and reports
its failures and exits to it once (``ChildExit``): a failure in ``on_start``,
in a message handler (``on_failure``) or in a thread started with
:meth:`SupervisedActor.spawn_thread`; a stop the supervisor did not ask for is
reported as a normal exit.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pykka

from actors.future import CallbackFuture
from actors.timers import TimerInbox
from chalie.wire.actor_messages import ChildExit

log = logging.getLogger("chalie.supervisor")


# -- the binding a child picks up while the supervisor starts it --------------


@dataclass(frozen=True)
class _Binding:
    supervisor: pykka.ActorRef[Any]
    child_id: str


_starting = threading.local()


def describe_error(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _wrap_on_start(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(fn)
    def on_start(self: SupervisedActor) -> None:
        try:
            fn(self)
        except Exception as exc:
            self._report_exit(abnormal=True, error=f"on_start: {describe_error(exc)}")
            raise

    return on_start


def _wrap_on_failure(fn: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(fn)
    def on_failure(
        self: SupervisedActor,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Reported after the hook, so the child's cleanup finishes before a restart.
        try:
            fn(self, exc_type, exc, tb)
        finally:
            self._report_exit(abnormal=True, error=describe_error(exc))

    return on_failure


def _wrap_on_stop(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(fn)
    def on_stop(self: SupervisedActor) -> None:
        try:
            fn(self)
        except Exception as exc:
            self._report_exit(abnormal=True, error=f"on_stop: {describe_error(exc)}")
            raise
        crashed = self._thread_error
        self._report_exit(abnormal=crashed is not None, error=crashed or "")

    return on_stop


@contextlib.contextmanager
def binding(supervisor: pykka.ActorRef[Any], child_id: str) -> Iterator[None]:
    """While a supervisor starts child ``child_id``: a SupervisedActor made now binds to it."""
    _starting.binding = _Binding(supervisor, child_id)
    try:
        yield
    finally:
        _starting.binding = None


def tell_quietly(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Tell ``ref`` ``message``; an actor that has stopped meanwhile hears nothing.

    The one way a callback, a subscription or another thread tells an actor that may be gone.
    """
    try:  # not contextlib.suppress: this runs for every result an executor reports
        ref.tell(message)
    except pykka.ActorDeadError:
        pass


class Actor(pykka.ThreadingActor):
    """Our threading actor: asks answered with a :class:`CallbackFuture`; timers in the inbox.

    Both through pykka's hooks for actor implementations. An actor's own timers are
    :meth:`schedule` and :meth:`unschedule` (on its thread): the message comes out of
    the inbox when due, as if it had been sent (:mod:`actors.timers`), so no timer
    thread runs and the actor's state stays on its thread.
    """

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return CallbackFuture()

    @staticmethod
    def _create_actor_inbox() -> Any:
        return TimerInbox()

    @property
    def timers(self) -> TimerInbox:
        inbox = self.actor_inbox
        assert isinstance(inbox, TimerInbox)
        return inbox

    def schedule(self, seconds: float, message: Any) -> int:
        """Deliver ``message`` to this actor after ``seconds`` (its thread only); a handle."""
        return self.timers.add(seconds, message)

    def unschedule(self, handle: int) -> None:
        """Forget a timer (a handle that fired or was forgotten already is ignored)."""
        self.timers.cancel(handle)

    @property
    def stop_requested(self) -> bool:
        """Whether this actor is about to be stopped (see :func:`request_stop`): a long step
        that does not read the mailbox, such as a first build in ``on_start``, may end early."""
        return self.timers.stop_requested.is_set()


def request_stop(ref: pykka.ActorRef[Any]) -> None:
    """Tell the actor behind ``ref`` that a stop is coming, before sending it: its
    :attr:`Actor.stop_requested` turns true at once, while the stop message waits in the
    mailbox behind whatever the actor is busy with. Any other actor: nothing."""
    inbox = getattr(ref, "actor_inbox", None)
    if isinstance(inbox, TimerInbox):
        inbox.stop_requested.set()


class SupervisedActor(Actor):
    """Base for supervised children: reports its failures and exits to its supervisor.

    Subclasses override ``on_start``, ``on_stop`` and ``on_failure`` as usual
    (the reporting is wrapped around them), and start any long-lived thread of
    their own with :meth:`spawn_thread` so a crash there is noticed too.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Wrapping each override keeps reporting out of the subclass's hands.
        if "on_start" in cls.__dict__:
            cls.on_start = _wrap_on_start(cls.__dict__["on_start"])  # type: ignore[method-assign,assignment]
        if "on_failure" in cls.__dict__:
            cls.on_failure = _wrap_on_failure(cls.__dict__["on_failure"])  # type: ignore[method-assign,assignment]
        if "on_stop" in cls.__dict__:
            cls.on_stop = _wrap_on_stop(cls.__dict__["on_stop"])  # type: ignore[method-assign,assignment]

    def __init__(self) -> None:
        super().__init__()
        binding: _Binding | None = getattr(_starting, "binding", None)
        self._binding = binding
        self._reported = False
        self._report_lock = threading.Lock()
        self._thread_error: str | None = None

    @property
    def supervised_as(self) -> str | None:
        """The child id this actor runs under, or None when unsupervised."""
        return self._binding.child_id if self._binding else None

    def _report_exit(self, *, abnormal: bool, error: str) -> None:
        with self._report_lock:
            if self._reported:
                return
            self._reported = True
        if abnormal:
            log.error(
                "%s (%s) failed: %s",
                self.supervised_as or type(self).__name__,
                self.actor_urn,
                error,
            )
        if self._binding is None:
            return
        try:
            self._binding.supervisor.tell(
                ChildExit(self._binding.child_id, self.actor_urn, abnormal, error)
            )
        except pykka.ActorDeadError:
            pass  # the supervisor is stopping the tree; nobody needs the report

    def spawn_thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        """Start a daemon thread whose crash fails this actor (and so is restarted)."""

        def run() -> None:
            try:
                target()
            except Exception as exc:
                log.exception("thread %s of %s crashed", name, self)
                # The stop runs the actor's own cleanup; on_stop then reports the crash.
                self._thread_error = f"thread {name}: {describe_error(exc)}"
                try:
                    self.actor_ref.stop(block=False)
                except pykka.ActorDeadError:
                    pass

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    def on_start(self) -> None:
        pass

    def on_end(self) -> None:
        """Release what the actor holds, however it ends: a subclass whose cleanup is the same
        on a stop and on a failure overrides this one hook instead of both."""

    def on_stop(self) -> None:
        self.on_end()

    def on_failure(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.on_end()


# The base's own hooks report too, for subclasses that override none of them.
SupervisedActor.on_start = _wrap_on_start(SupervisedActor.__dict__["on_start"])  # type: ignore[method-assign,assignment]
SupervisedActor.on_failure = _wrap_on_failure(SupervisedActor.__dict__["on_failure"])  # type: ignore[method-assign,assignment]
SupervisedActor.on_stop = _wrap_on_stop(SupervisedActor.__dict__["on_stop"])  # type: ignore[method-assign,assignment]
