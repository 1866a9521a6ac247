"""The supervisor actor: one_for_one over a list of ChildSpecs, itself a supervisable child.

The actor bases live in :mod:`actors.actor`, the restart-proof handle in
:mod:`actors.child_ref`, the child directory in :mod:`actors.directory` and the
future that calls back in :mod:`actors.future` (as pykka keeps its actor, ref
and future apart).

Lifecycle of a supervised child:

1. The supervisor calls ``spec.start()`` in its own thread; a ``SupervisedActor``
   constructed during that call binds itself to the supervisor and child id.
2. A failure in ``on_start``, in a message handler (``on_failure``) or in a
   thread started with ``spawn_thread`` is reported to the supervisor once,
   with the actor's urn and the error; a stop the supervisor did not ask for
   is reported as a normal exit.
3. The supervisor ignores reports from refs it has already replaced, applies
   ``chalie.process.supervision.RestartPolicy`` and restarts the child after the
   backoff delay (a timer tells the supervisor; it never sleeps).
4. Past the restart intensity it escalates: a nested supervisor reports itself
   failed to its parent; the root logs the child and its last error, stops the
   tree and calls ``on_escalate(child_id, last_error)`` from a new thread.
5. Stopping a supervisor stops its children in reverse start order, waiting
   for each at most its ``shutdown`` seconds (all at once, then waiting, when
   :attr:`Supervisor.STOP_TOGETHER`: children that do not depend on each other).

Children added at run time (:meth:`Supervisor.add_child`, OTP's
``simple_one_for_one`` children, made from a :class:`chalie.process.supervision.OnDemand`
template) are forgotten when their exit is not restarted (a transient child's
normal exit), and :meth:`Supervisor.dismiss_child` stops one without waiting for it.

Callers reach a child through ``ChildRef[A]`` (made by ``Directory.ref``),
which resolves the current ref on every call, so a restart shows only as a
``ChildUnavailable`` for the call in flight; its calls name the actor's
methods (``ref.call(PolicyActor.pending)``), so mypy checks them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import pykka

from actors.actor import SupervisedActor, binding, describe_error, request_stop
from actors.child_ref import ChildRef
from actors.directory import Directory
from chalie.process.supervision import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_INTENSITY,
    DEFAULT_PERIOD,
    ChildSpec,
    RestartPolicy,
    check_specs,
)
from chalie.wire.actor_messages import ChildExit, DismissedStopped, RestartChild, WatchChildren

log = logging.getLogger("chalie.supervisor")

# How often the supervisor looks for children that are not SupervisedActors and
# died without telling anyone.
WATCH_INTERVAL: Final = 0.5


@dataclass
class _Child:
    spec: ChildSpec
    ref: pykka.ActorRef[Any] | None = None
    last_error: str | None = None
    started_at: float | None = None
    token: int = 0  # bumps on every exit, so a stale restart timer does nothing
    supervised: bool = True
    attempts: int = 0
    dynamic: bool = False  # added at run time: forgotten when its exit is not restarted

    @property
    def restarts(self) -> int:
        return max(0, self.attempts - 1)


class Supervisor(SupervisedActor):
    """A one_for_one supervisor over a list of ChildSpecs; itself a supervisable child.

    ``Supervisor.start(specs, *, intensity=5, period=10.0, backoff_base=0.05,
    backoff_cap=2.0, on_escalate=None)``.
    """

    # Whether a stop stops every child at once and then waits (children that do not
    # depend on each other), rather than one by one in reverse start order.
    STOP_TOGETHER: bool = False

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
        self._escalated: tuple[str, str] | None = None
        self._shutting_down = False
        self.directory = directory if directory is not None else Directory()
        # Dismissed children not yet stopped: urn -> what runs once they have.
        self._dismissed: dict[str, Callable[[], None] | None] = {}

    # -- lifecycle ----------------------------------------------------------
    def on_start(self) -> None:
        for child in self._children:
            self._start_child(child)
        self._schedule(WATCH_INTERVAL, WatchChildren())

    def on_stop(self) -> None:
        self.stop_children()
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
        self.stop_children()

    def stop_children(self) -> None:
        """Stop every child (a stopping supervisor's first step; idempotent)."""
        self._shutting_down = True
        if not self.STOP_TOGETHER:
            for child in reversed(self._children):
                self._stop_child(child)
            return
        stops = []
        for child in reversed(self._children):
            ref, child.ref = child.ref, None
            child.token += 1
            self.directory.set(child.spec.id, None)
            if ref is not None:
                request_stop(ref)
                stops.append((child, ref.stop(block=False)))
        deadline = time.monotonic() + max((c.spec.shutdown for c, _ in stops), default=0.0)
        for child, stop in stops:
            try:
                stop.get(timeout=max(0.0, deadline - time.monotonic()))
            except pykka.Timeout:
                log.error("child %s did not stop within %.1f s", child.spec.id, child.spec.shutdown)
            except pykka.ActorDeadError:
                pass

    # -- the API --------------------------------------------------------------
    def child(self, id: str) -> pykka.ActorRef[Any] | None:
        """The child's current ref (a restart gives a new one), or None."""
        child = self._by_id.get(id)
        return child.ref if child else None

    def has_child(self, id: str) -> bool:
        """Whether ``id`` is a child (running, or waiting for its restart)."""
        return id in self._by_id

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
        child = _Child(spec, dynamic=True)
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

    def dismiss_child(self, id: str, then: Callable[[], None] | None = None) -> bool:
        """Forget a child and ask it to stop, without waiting (no restart); False: no child.

        ``then`` runs on this actor's thread once the child has stopped (its exit
        report), or when its ``shutdown`` seconds are up, whichever comes first.
        """
        child = self._by_id.pop(id, None)
        if child is None:
            return False
        self._children.remove(child)
        ref, child.ref = child.ref, None
        child.token += 1
        self.directory.set(id, None)
        if ref is None or not ref.is_alive():
            if then is not None:
                then()
            return True
        self._dismissed[ref.actor_urn] = then
        self._schedule(child.spec.shutdown, DismissedStopped(ref.actor_urn))
        try:
            ref.stop(block=False)
        except pykka.ActorDeadError:
            self._stopped_dismissed(ref.actor_urn)
        return True

    def _stopped_dismissed(self, urn: str) -> None:
        if urn in self._dismissed:
            then = self._dismissed.pop(urn)
            if then is not None:
                then()

    def child_forgotten(self, id: str) -> None:
        """Hook: a child added at run time exited and is not restarted, so it is forgotten."""

    def restart_child(self, id: str) -> bool:
        """Stop a child and start it again now, from its spec; False when there is none.

        An operator's restart (after a configuration change), not a failure: the restart
        intensity is not spent and ``restarts`` does not count it.
        """
        child = self._by_id.get(id)
        if child is None:
            return False
        self._stop_child(child)
        self._start_child(child)
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
        elif isinstance(message, DismissedStopped):
            self._stopped_dismissed(message.urn)
        else:
            log.warning("supervisor ignored an unexpected message %r", type(message).__name__)
        return None

    def _child_exited(self, msg: ChildExit) -> None:
        if msg.urn in self._dismissed:
            self._stopped_dismissed(msg.urn)
            return
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
            if child.dynamic:
                self._forget(child)
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
        try:
            with binding(self.actor_ref, child.spec.id):
                ref = child.spec.start()
            if not isinstance(ref, pykka.ActorRef):
                raise TypeError(f"start returned {type(ref).__name__}, not an ActorRef")
        except Exception as exc:
            log.exception("starting child %s failed", child.spec.id)
            child.ref = None
            child.started_at = None
            self._handle_failed_start(child, describe_error(exc))
            return
        child.ref = ref
        child.started_at = time.time()
        child.supervised = issubclass(ref.actor_class, SupervisedActor)
        self.directory.set(child.spec.id, ref)

    def _forget(self, child: _Child) -> None:
        if self._by_id.get(child.spec.id) is child:
            del self._by_id[child.spec.id]
            self._children.remove(child)
            self.child_forgotten(child.spec.id)

    def _handle_failed_start(self, child: _Child, error: str) -> None:
        # A start that raised counts as a failed incarnation, like on_start failing.
        child.token += 1
        child.last_error = f"start: {error}"
        decision = self._policy.on_exit(child.spec, abnormal=True, now=self._clock())
        if decision.action == "escalate":
            self._escalate(child)
        elif decision.action == "restart":
            self._schedule(decision.delay, RestartChild(child.spec.id, child.token))
        elif child.dynamic:
            self._forget(child)

    def _stop_child(self, child: _Child) -> None:
        ref, child.ref = child.ref, None
        child.token += 1
        self.directory.set(child.spec.id, None)
        if ref is None:
            return
        request_stop(ref)
        try:
            ref.stop(block=False).get(timeout=child.spec.shutdown)
        except pykka.Timeout:
            log.error("child %s did not stop within %.1f s", child.spec.id, child.spec.shutdown)
        except pykka.ActorDeadError:
            pass

    def _schedule(self, delay: float, message: Any) -> None:
        # In this actor's inbox (actors.actor.Actor.schedule): no timer thread, and a
        # stopped supervisor's timers simply never come out.
        self.schedule(delay, message)
