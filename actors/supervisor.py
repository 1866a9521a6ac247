"""The supervisor actor (one_for_one) and the ``SupervisedActor`` base its children use.

Lifecycle of a supervised child:

1. The supervisor calls ``spec.start()`` in its own thread; a ``SupervisedActor``
   constructed during that call binds itself to the supervisor and child id.
2. A failure in ``on_start``, in a message handler (``on_failure``) or in a
   thread started with ``spawn_thread`` is reported to the supervisor once,
   with the actor's urn and the error; a stop the supervisor did not ask for
   is reported as a normal exit.
3. The supervisor ignores reports from refs it has already replaced, applies
   ``chalie.supervision.RestartPolicy`` and restarts the child after the
   backoff delay (a timer tells the supervisor; it never sleeps).
4. Past the restart intensity it escalates: a nested supervisor reports itself
   failed to its parent; the root logs the child and its last error, stops the
   tree and calls ``on_escalate(child_id, last_error)`` from a new thread.
5. Stopping a supervisor stops its children in reverse start order, waiting
   for each at most its ``shutdown`` seconds.

Callers reach a child through ``ChildRef[A]`` (made by ``Directory.ref``),
which resolves the current ref on every call, so a restart shows only as a
``ChildUnavailable`` for the call in flight; its calls name the actor's
methods (``ref.call(PolicyActor.pending)``), so mypy checks them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Concatenate, Final, Generic, ParamSpec, TypeVar

import pykka

from chalie.faults import FAULTS
from chalie.messages import ChildExit, RestartChild, WatchChildren
from chalie.result import ToolResult
from chalie.supervision import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_INTENSITY,
    DEFAULT_PERIOD,
    ChildSpec,
    RestartPolicy,
    check_specs,
)

__all__ = [
    "ChildRef",
    "ChildSpec",
    "ChildUnavailable",
    "Directory",
    "SupervisedActor",
    "Supervisor",
]

log = logging.getLogger("chalie.supervisor")

A = TypeVar("A", bound=pykka.Actor)
P = ParamSpec("P")
R = TypeVar("R")

# How long a ChildRef.call waits for the actor's answer unless told otherwise.
DEFAULT_CALL_TIMEOUT: Final = 30.0

# How often the supervisor looks for children that are not SupervisedActors and
# died without telling anyone.
WATCH_INTERVAL: Final = 0.5


# -- the binding a child picks up while the supervisor starts it --------------


@dataclass(frozen=True)
class _Binding:
    supervisor: pykka.ActorRef[Any]
    child_id: str


_starting = threading.local()


def _describe(exc: BaseException | None) -> str:
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
            self._report_exit(abnormal=True, error=f"on_start: {_describe(exc)}")
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
            self._report_exit(abnormal=True, error=_describe(exc))

    return on_failure


def _wrap_on_stop(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(fn)
    def on_stop(self: SupervisedActor) -> None:
        try:
            fn(self)
        except Exception as exc:
            self._report_exit(abnormal=True, error=f"on_stop: {_describe(exc)}")
            raise
        crashed = self._thread_error
        self._report_exit(abnormal=crashed is not None, error=crashed or "")

    return on_stop


class CallbackFuture(pykka.ThreadingFuture[Any]):
    """pykka's threading future that also calls back when it is answered.

    Every ask of an :class:`Actor` returns one (pykka's
    ``_create_future`` hook), so async code can await an actor's answer
    without a thread blocked on it (:meth:`ChildRef.acall`). The callbacks run
    on the answering thread (the actor's, or the one that stops it and fails
    what is left in its inbox with ActorDeadError).
    """

    def __init__(self) -> None:
        super().__init__()
        self._hook_lock = threading.Lock()
        self._settled = False
        self._callbacks: list[Callable[[CallbackFuture], None]] = []

    def add_done_callback(self, fn: Callable[[CallbackFuture], None]) -> None:
        """Call ``fn(self)`` once answered (at once if it already is)."""
        with self._hook_lock:
            if not self._settled:
                self._callbacks.append(fn)
                return
        fn(self)

    def set(self, value: Any | None = None) -> None:
        super().set(value)
        self._settle()

    def set_exception(self, exc_info: Any = None) -> None:
        super().set_exception(exc_info if exc_info is not None else sys.exc_info())
        self._settle()

    def _settle(self) -> None:
        with self._hook_lock:
            self._settled = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("a future's callback failed")


class Actor(pykka.ThreadingActor):
    """Our threading actor: asks answered with a :class:`CallbackFuture`, a C inbox.

    Both through pykka's hooks for actor implementations.
    """

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return CallbackFuture()

    @staticmethod
    def _create_actor_inbox() -> Any:
        # The C SimpleQueue hands a message over in about half the time of queue.Queue
        # (no Condition, no task accounting) and has all an inbox needs.
        return queue.SimpleQueue()


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
                self._thread_error = f"thread {name}: {_describe(exc)}"
                try:
                    self.actor_ref.stop(block=False)
                except pykka.ActorDeadError:
                    pass

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass

    def on_failure(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


# The base's own hooks report too, for subclasses that override none of them.
SupervisedActor.on_start = _wrap_on_start(SupervisedActor.__dict__["on_start"])  # type: ignore[method-assign,assignment]
SupervisedActor.on_failure = _wrap_on_failure(SupervisedActor.__dict__["on_failure"])  # type: ignore[method-assign,assignment]
SupervisedActor.on_stop = _wrap_on_stop(SupervisedActor.__dict__["on_stop"])  # type: ignore[method-assign,assignment]


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


class Directory:
    """child id -> current ref, written by the supervisor thread, read by any thread.

    The composition root may create it and hand it to the Supervisor, so
    restart-proof :class:`ChildRef` handles can be made without asking the
    supervisor anything.
    """

    def __init__(self) -> None:
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._lock = threading.Lock()

    def set(self, child_id: str, ref: pykka.ActorRef[Any] | None) -> None:
        with self._lock:
            if ref is None:
                self._refs.pop(child_id, None)
            else:
                self._refs[child_id] = ref

    def get(self, child_id: str) -> pykka.ActorRef[Any] | None:
        with self._lock:
            return self._refs.get(child_id)

    def ref(self, child_id: str, kind: type[A]) -> ChildRef[A]:
        """A typed, restart-proof handle on the child ``child_id``, an actor of class ``kind``."""
        return ChildRef(functools.partial(self.get, child_id), child_id, kind)


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
            raise TypeError(f"{self.child_id} is not an actors.supervisor.Actor; use call()")
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


@dataclass
class _Child:
    spec: ChildSpec
    ref: pykka.ActorRef[Any] | None = None
    last_error: str | None = None
    started_at: float | None = None
    token: int = 0  # bumps on every exit, so a stale restart timer does nothing
    supervised: bool = True
    attempts: int = 0

    @property
    def restarts(self) -> int:
        return max(0, self.attempts - 1)


class Supervisor(SupervisedActor):
    """A one_for_one supervisor over a list of ChildSpecs; itself a supervisable child.

    ``Supervisor.start(specs, *, intensity=5, period=10.0, backoff_base=0.05,
    backoff_cap=2.0, on_escalate=None)``.
    """

    def __init__(
        self,
        specs: list[ChildSpec] | tuple[ChildSpec, ...],
        *,
        intensity: int = DEFAULT_INTENSITY,
        period: float = DEFAULT_PERIOD,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_cap: float = DEFAULT_BACKOFF_CAP,
        on_escalate: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        directory: Directory | None = None,
    ) -> None:
        super().__init__()
        check_specs(list(specs))
        self._policy = RestartPolicy(
            intensity=intensity, period=period, backoff_base=backoff_base, backoff_cap=backoff_cap
        )
        self._children = [_Child(spec) for spec in specs]
        self._by_id = {c.spec.id: c for c in self._children}
        self._on_escalate = on_escalate
        self._clock = clock
        self._born = time.monotonic()
        self._timers: set[threading.Timer] = set()
        self._escalated: tuple[str, str] | None = None
        self._shutting_down = False
        self.directory = directory if directory is not None else Directory()

    # -- lifecycle ----------------------------------------------------------
    def on_start(self) -> None:
        for child in self._children:
            self._start_child(child)
        self._schedule(WATCH_INTERVAL, WatchChildren())

    def on_stop(self) -> None:
        self._shutting_down = True
        for timer in list(self._timers):
            timer.cancel()
        for child in reversed(self._children):
            self._stop_child(child)
        if self._escalated is not None and self._binding is None:
            child_id, error = self._escalated
            callback = self._on_escalate
            if callback is not None:
                threading.Thread(
                    target=callback, args=(child_id, error), name="supervisor-escalate", daemon=True
                ).start()

    def on_failure(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The supervisor itself crashed: take the children down with it so the
        # restarted supervisor does not meet orphans.
        self._shutting_down = True
        for child in reversed(self._children):
            self._stop_child(child)

    # -- the API --------------------------------------------------------------
    def child(self, id: str) -> pykka.ActorRef[Any] | None:
        """The child's current ref (a restart gives a new one), or None."""
        child = self._by_id.get(id)
        return child.ref if child else None

    def child_ref(self, id: str) -> ChildRef[Any]:
        """A restart-proof handle on a child, usable from any thread (see Directory.ref)."""
        if id not in self._by_id:
            raise KeyError(f"no child {id!r}")
        return self.directory.ref(id, pykka.Actor)

    def add_child(self, spec: ChildSpec) -> None:
        """Start one more child at run time (on this actor's thread: from a subclass's handler).

        The id must be new; a start that fails is handled like any failed
        incarnation (restarted by the policy, or escalated).
        """
        check_specs([spec])
        if spec.id in self._by_id:
            raise ValueError(f"two children with id {spec.id!r}")
        child = _Child(spec)
        self._children.append(child)
        self._by_id[spec.id] = child
        self._start_child(child)

    def remove_child(self, id: str) -> bool:
        """Stop a child and forget it (no restart); False when there is no such child."""
        child = self._by_id.pop(id, None)
        if child is None:
            return False
        self._children.remove(child)
        self._stop_child(child)
        return True

    def status(self) -> dict[str, Any]:
        return {
            "children": [
                {
                    "id": c.spec.id,
                    "alive": c.ref is not None and c.ref.is_alive(),
                    "restarts": c.restarts,
                    "last_error": c.last_error,
                    "started_at": c.started_at,
                }
                for c in self._children
            ],
            "uptime": time.monotonic() - self._born,
        }

    # -- messages -------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ChildExit):
            self._child_exited(message)
        elif isinstance(message, RestartChild):
            child = self._by_id.get(message.child_id)
            if child is not None and child.token == message.token and child.ref is None:
                self._start_child(child)
        elif isinstance(message, WatchChildren):
            self._watch()
        else:
            log.warning("supervisor ignored an unexpected message %r", type(message).__name__)
        return None

    def _child_exited(self, msg: ChildExit) -> None:
        child = self._by_id.get(msg.child_id)
        if child is None or child.ref is None or child.ref.actor_urn != msg.urn:
            log.debug("ignored a stale exit report from %s (%s)", msg.child_id, msg.urn)
            return
        self._handle_exit(child, abnormal=msg.abnormal, error=msg.error)

    def _handle_exit(self, child: _Child, *, abnormal: bool, error: str) -> None:
        if self._shutting_down:
            return
        old = child.ref
        child.ref = None
        child.token += 1
        self.directory.set(child.spec.id, None)
        if old is not None:
            old.stop(block=False)  # a thread crash leaves the actor itself running
        if abnormal:
            child.last_error = error
        decision = self._policy.on_exit(child.spec, abnormal=abnormal, now=self._clock())
        if decision.action == "ignore":
            log.info(
                "child %s exited (%s); not restarted (%s)",
                child.spec.id,
                "failed" if abnormal else "normal",
                child.spec.restart,
            )
            return
        if decision.action == "escalate":
            self._escalate(child)
            return
        log.info("restarting %s in %.3f s", child.spec.id, decision.delay)
        self._schedule(decision.delay, RestartChild(child.spec.id, child.token))

    def _escalate(self, child: _Child) -> None:
        error = child.last_error or "exited"
        window = self._policy.window
        reason = (
            f"child {child.spec.id} exceeded the restart intensity "
            f"({window.intensity} in {window.period:g} s); last error: {error}"
        )
        self._escalated = (child.spec.id, error)
        if self._binding is not None:
            log.error("supervisor %s escalates: %s", self.supervised_as, reason)
            self._report_exit(abnormal=True, error=f"{child.spec.id}: {error}")
        else:
            log.error("root supervisor shutting down: %s", reason)
        self.actor_ref.stop(block=False)

    def _watch(self) -> None:
        for child in self._children:
            ref = child.ref
            if ref is not None and not child.supervised and not ref.is_alive():
                self._handle_exit(child, abnormal=True, error="actor died without a report")
        if not self._shutting_down:
            self._schedule(WATCH_INTERVAL, WatchChildren())

    # -- starting and stopping children -----------------------------------------
    def _start_child(self, child: _Child) -> None:
        child.attempts += 1
        _starting.binding = _Binding(self.actor_ref, child.spec.id)
        try:
            ref = child.spec.start()
            if not isinstance(ref, pykka.ActorRef):
                raise TypeError(f"start returned {type(ref).__name__}, not an ActorRef")
        except Exception as exc:
            log.exception("starting child %s failed", child.spec.id)
            child.ref = None
            child.started_at = None
            self._handle_failed_start(child, _describe(exc))
            return
        finally:
            _starting.binding = None
        child.ref = ref
        child.started_at = time.time()
        child.supervised = issubclass(ref.actor_class, SupervisedActor)
        self.directory.set(child.spec.id, ref)

    def _handle_failed_start(self, child: _Child, error: str) -> None:
        # A start that raised counts as a failed incarnation, like on_start failing.
        child.token += 1
        child.last_error = f"start: {error}"
        decision = self._policy.on_exit(child.spec, abnormal=True, now=self._clock())
        if decision.action == "escalate":
            self._escalate(child)
        elif decision.action == "restart":
            self._schedule(decision.delay, RestartChild(child.spec.id, child.token))

    def _stop_child(self, child: _Child) -> None:
        ref, child.ref = child.ref, None
        child.token += 1
        self.directory.set(child.spec.id, None)
        if ref is None:
            return
        try:
            ref.stop(block=False).get(timeout=child.spec.shutdown)
        except pykka.Timeout:
            log.error("child %s did not stop within %.1f s", child.spec.id, child.spec.shutdown)
        except pykka.ActorDeadError:
            pass

    def _schedule(self, delay: float, message: Any) -> None:
        ref = self.actor_ref

        def fire() -> None:
            self._timers.discard(timer)
            try:
                ref.tell(message)
            except pykka.ActorDeadError:
                pass

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        self._timers.add(timer)
        timer.start()
