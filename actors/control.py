"""The control endpoint: a ZeroMQ ROUTER on ipc://<home>/control.sock, served on the loop thread.

Lifecycle, in order:

1. :meth:`ControlEndpoint.start` binds the socket (the file chmod 0600) from a
   coroutine on the daemon's :class:`~actors.loop.EventLoopThread`.
2. Each request frame is checked by :func:`chalie.control.parse_request`; a
   bad one is answered with a structured error at once, on the loop.
3. A good one runs its handler on a small thread pool, so a slow command (a
   tool call waiting for a human's approval, a long-poll) never holds up
   ``status`` from another terminal; the reply goes back to that client only.
4. Any fault inside a handler becomes an ``internal-error`` reply and is
   logged: the endpoint keeps serving.
5. :meth:`ControlEndpoint.stop` cancels the serving task, closes the socket
   and removes the socket file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import msgspec
import pykka
import zmq
import zmq.asyncio

from actors.dispatcher import DispatcherActor, submit
from actors.loop import EventLoopThread
from actors.policy import PolicyActor
from actors.supervisor import ChildUnavailable, SupervisedActor
from chalie import control
from chalie.events import Subscription
from chalie.messages import ControlReply, PermissionRequest, ToolCall, ToolOutcome, TurnContext
from chalie.policy import PolicyError
from chalie.trail import Trail

if TYPE_CHECKING:
    from chalie.daemon import Runtime

log = logging.getLogger("chalie.control")

Handler = Callable[[str, control.Args], ControlReply]
# A frame larger than this makes libzmq drop the peer before we read it:
# a memory bound. Requests between MAX_REQUEST_BYTES and this are answered
# with oversized-request.
_TRANSPORT_LIMIT: Final = 8 * 1024 * 1024
_MAX_IN_FLIGHT: Final = 64
_ACTOR_TIMEOUT: Final = 10.0


class ControlEndpoint:
    """Serves control requests for one daemon; ``handler`` does the work of each command."""

    def __init__(
        self, home: Path, loop: EventLoopThread, handler: Handler, *, threads: int = 8
    ) -> None:
        self.home = home
        self._loop = loop
        self._handler = handler
        self._pool = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="chalie-control"
        )
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._inode: int | None = None
        self._on_exit: Callable[[BaseException | None], None] | None = None
        self._in_flight = 0
        self.served = 0

    # -- lifecycle ----------------------------------------------------------------
    def start(self, timeout: float = 5.0) -> None:
        bound: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop.submit(self._start(bound)).result(timeout)
        bound.result(timeout)

    async def _start(self, bound: concurrent.futures.Future[None]) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._serve(bound), name="control-endpoint"
        )
        self._task.add_done_callback(self._served)

    def on_exit(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(error)`` on the loop thread if serving ends without stop()."""
        self._on_exit = callback
        if self._task is not None and self._task.done():
            self._served(self._task)

    def _served(self, task: asyncio.Task[None]) -> None:
        # Always retrieve the outcome, so asyncio never reports it as unretrieved.
        error = None if task.cancelled() else task.exception()
        if self._stopping or self._on_exit is None:
            return
        log.error("control endpoint stopped serving: %r", error)
        self._on_exit(error)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        if self._task is not None and self._loop.is_alive():
            task = self._task

            async def cancel() -> None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

            try:
                self._loop.submit(cancel()).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                log.error("control endpoint did not stop: %s", exc)
        self._pool.shutdown(wait=False, cancel_futures=True)
        path = control.socket_path(self.home)
        try:
            # Only our own socket file: a restarted endpoint may have bound a new one.
            if self._inode is not None and os.stat(path).st_ino == self._inode:
                path.unlink()
        except FileNotFoundError:
            pass

    def is_serving(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- the socket ---------------------------------------------------------------
    async def _serve(self, bound: concurrent.futures.Future[None]) -> None:
        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, _TRANSPORT_LIMIT)
        path = control.socket_path(self.home)
        try:
            path.unlink(missing_ok=True)  # a stale file from a killed daemon; we hold the lock
            sock.bind(control.endpoint(self.home))
            os.chmod(path, 0o600)
            self._inode = os.stat(path).st_ino
        except BaseException as exc:
            sock.close()
            bound.set_exception(exc)
            raise
        bound.set_result(None)
        log.info("control endpoint listening", extra={"socket": str(path)})
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                frames = await sock.recv_multipart()
                task = asyncio.get_running_loop().create_task(self._answer(sock, frames))
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            sock.close()

    async def _answer(self, sock: zmq.asyncio.Socket, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return  # not even an identity and a body: nobody to answer
        ident, route, body = frames[0], frames[1:-1], frames[-1]
        if any(route):
            # REQ puts one empty delimiter before the body; anything else is a
            # multi-part body we do not speak. Answer on a clean envelope.
            reply = control.failure(control.MALFORMED, "a request is exactly one frame")
            route = [b""] if frames[1] == b"" else []
        else:
            reply = await self._reply_to(body)
        try:
            await sock.send_multipart([ident, *route, control.encode_reply(reply)])
        except zmq.ZMQError as exc:
            log.info("control client went away before its reply: %s", exc)

    async def _reply_to(self, body: bytes) -> ControlReply:
        parsed = control.parse_request(body)
        if isinstance(parsed, ControlReply):
            log.warning("bad control request: %s", parsed.error, extra={"bytes": len(body)})
            return parsed
        command, args = parsed
        if self._in_flight >= _MAX_IN_FLIGHT:
            return control.failure(
                control.UNAVAILABLE, "too many control requests in flight; retry"
            )
        self._in_flight += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._run_handler, command, args)
        except RuntimeError as exc:  # the pool is shut down: the daemon is stopping
            return control.failure(control.UNAVAILABLE, f"the daemon is stopping ({exc})")
        finally:
            self._in_flight -= 1
            self.served += 1

    def _run_handler(self, command: str, args: control.Args) -> ControlReply:
        try:
            return self._handler(command, args)
        except Exception as exc:
            log.exception("control command %s failed", command)
            return control.failure(
                control.INTERNAL, f"{command} failed: {type(exc).__name__}: {exc}"
            )


# -- what each command does ------------------------------------------------------------


@dataclass
class _CliCall:
    """A CLI tools.call: its outcome future and its conversation's permission requests."""

    call_id: str
    conversation_id: str
    future: concurrent.futures.Future[ToolOutcome]
    news: threading.Event = field(default_factory=threading.Event)
    requests: list[PermissionRequest] = field(default_factory=list)
    subscription: Subscription | None = None
    touched: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_event(self, event: Any) -> None:
        # Runs on the publisher's thread (the PolicyActor's): append and wake, nothing more.
        if isinstance(event, PermissionRequest):
            with self.lock:
                self.requests.append(event)
            self.news.set()

    def take_requests(self) -> list[PermissionRequest]:
        with self.lock:
            taken, self.requests = self.requests, []
        return taken


class CallDesk:
    """Tool calls started from the CLI, polled for their outcome and permission requests.

    The dispatcher answers a call with a future; the desk keeps it, with a
    subscription to the call's conversation, so a long-poll hands the CLI
    each PermissionRequest as it is published and the outcome once it exists.
    A call nobody polls for ``forget_after`` seconds is dropped.
    """

    def __init__(self, rt: Runtime, *, forget_after: float = 900.0) -> None:
        self._rt = rt
        self._calls: dict[str, _CliCall] = {}
        self._lock = threading.Lock()
        self._forget_after = forget_after

    def start(self, args: control.ToolsCallArgs) -> ControlReply:
        self._forget_stale()
        call_id = f"cli-{uuid.uuid4().hex[:16]}"
        conversation = args.conversation_id or f"cli-{uuid.uuid4().hex[:12]}"
        call = ToolCall(
            call_id=call_id,
            tool=args.tool,
            arguments=args.arguments,
            context=TurnContext(
                conversation_id=conversation,
                turn_id=f"{call_id}-turn",
                channel="chat",
                human_present=True,
                scope="unrestricted",  # the operator may call any registered tool
                initiator="framework",  # the operator need not write an act_summary
            ),
        )
        entry = _CliCall(call_id, conversation, concurrent.futures.Future())
        # Subscribe before dispatching: the gate may ask at once.
        entry.subscription = self._rt.events.subscribe(conversation, entry.on_event)
        try:
            entry.future = submit(self._rt.child("dispatcher", DispatcherActor).current(), call)
        except Exception:
            entry.subscription.close()
            raise
        entry.future.add_done_callback(lambda _f: entry.news.set())
        # The CLI call is its own turn: what find_tools injected into it ends with it.
        turns = self._rt.services.turns
        entry.future.add_done_callback(lambda _f: turns.forget(call.context.turn_id))
        with self._lock:
            self._calls[call_id] = entry
        return control.success({"call_id": call_id, "conversation_id": conversation})

    def poll(self, args: control.ToolsPollArgs) -> ControlReply:
        with self._lock:
            entry = self._calls.get(args.call_id)
        if entry is None:
            return control.failure(control.NOT_FOUND, f"no call {args.call_id!r} in progress")
        entry.touched = time.monotonic()
        entry.news.wait(args.wait)
        entry.news.clear()
        shown = [msgspec.to_builtins(r) for r in entry.take_requests()]
        if not entry.future.done():
            # Anything that lands after the clear sets news again: the next poll sees it.
            return control.success({"state": "pending", "permission_requests": shown})
        self._finish(entry)
        try:
            outcome = entry.future.result()
        except Exception as exc:
            log.error("tools.call %s failed in the runtime: %s", entry.call_id, exc)
            return control.failure(control.UNAVAILABLE, f"the call failed in the runtime: {exc}")
        return control.success(
            {"state": "done", "permission_requests": shown, "outcome": msgspec.to_builtins(outcome)}
        )

    def _finish(self, entry: _CliCall) -> None:
        if entry.subscription is not None:
            entry.subscription.close()
        with self._lock:
            self._calls.pop(entry.call_id, None)

    def _forget_stale(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [c for c in self._calls.values() if now - c.touched > self._forget_after]
        for entry in stale:
            log.info("forgot an unpolled CLI call", extra={"call_id": entry.call_id})
            self._finish(entry)

    def close(self) -> None:
        with self._lock:
            entries = list(self._calls.values())
        for entry in entries:
            self._finish(entry)
            entry.news.set()  # a long-poll in progress returns now, not at its timeout


class ControlCommands:
    """The daemon's side of every control command, bound to the running tree."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self.desk = CallDesk(rt)
        self._book: Trail | None = None
        self._book_lock = threading.Lock()

    def _trail(self) -> Trail:
        # Opened on first use, from a handler thread: the Trail serialises its connection.
        with self._book_lock:
            if self._book is None:
                self._book = Trail(self._rt.db_path)
            return self._book

    def close(self) -> None:
        self.desk.close()
        if self._book is not None:
            self._book.close()
            self._book = None

    def __call__(self, command: str, args: control.Args) -> ControlReply:
        try:
            return self._run(command, args)
        except ChildUnavailable as exc:
            return control.failure(control.UNAVAILABLE, str(exc))
        except PolicyError as exc:
            return control.failure(control.INVALID_ARGS, str(exc))

    def _run(self, command: str, args: control.Args) -> ControlReply:
        rt = self._rt
        if command == "status":
            return control.success(rt.status())
        if command == "stop":
            log.info("stop requested over the control socket")
            rt.request_stop()
            return control.success({"stopping": True, "pid": os.getpid()})
        if isinstance(args, control.ToolsCallArgs):
            return self.desk.start(args)
        if isinstance(args, control.ToolsPollArgs):
            return self.desk.poll(args)
        if isinstance(args, control.ToolsCancelArgs):
            dispatcher = rt.child("dispatcher", DispatcherActor).within(_ACTOR_TIMEOUT)
            cancelled = dispatcher.call(DispatcherActor.cancel_call, args.call_id)
            return control.success({"call_id": args.call_id, "cancelled": cancelled})
        if isinstance(args, control.TrailArgs):
            rows = self._trail().query(
                tool=args.tool,
                status=args.status,
                conversation_id=args.conversation,
                limit=args.limit,
            )
            return control.success(msgspec.to_builtins(rows))
        policy = rt.child("policy", PolicyActor).within(_ACTOR_TIMEOUT)
        if command == "policy.list":
            return control.success(
                {
                    "rules": msgspec.to_builtins(policy.call(PolicyActor.list)),
                    "pending": msgspec.to_builtins(policy.call(PolicyActor.pending)),
                }
            )
        if command == "policy.pending":
            return control.success(msgspec.to_builtins(policy.call(PolicyActor.pending)))
        if isinstance(args, control.PolicySetArgs):
            policy.call(PolicyActor.set, args.channel, args.permission, args.decision)
            return control.success(msgspec.to_builtins(args))
        if isinstance(args, control.PolicyResetArgs):
            removed = policy.call(
                PolicyActor.reset, channel=args.channel, permission=args.permission
            )
            return control.success({"removed": msgspec.to_builtins(removed)})
        if isinstance(args, control.PolicyAnswerArgs):
            found = policy.call(PolicyActor.answer, args.request_id, args.answer)
            if found is False:
                return control.failure(
                    control.NOT_FOUND, f"no pending permission request {args.request_id!r}"
                )
            return control.success({"request_id": args.request_id, "answer": args.answer})
        if command == "ask" or command.startswith("conversations."):
            from actors.conversations import control_command

            return control_command(rt, command, args)
        return control.failure(control.UNKNOWN_COMMAND, f"no handler for {command!r}")


class ControlActor(SupervisedActor):
    """The tree's child for the control endpoint: starts it, stops it, fails when it dies."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self._rt = rt
        self._commands = ControlCommands(rt)
        self._endpoint = ControlEndpoint(rt.config.home, rt.loop, self._commands)

    def on_start(self) -> None:
        self._endpoint.start()
        self._endpoint.on_exit(self._endpoint_exited)

    def _endpoint_exited(self, error: BaseException | None) -> None:
        # Runs on the loop thread: hand the failure to the actor, whose
        # on_receive raising under a tell fails it, and the supervisor restarts it.
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(_EndpointDied(error))

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _EndpointDied):
            raise RuntimeError(f"control endpoint stopped serving: {message.error!r}")
        return None

    def on_stop(self) -> None:
        self._close()

    def on_failure(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()

    def _close(self) -> None:
        self._endpoint.stop()
        self._commands.close()


@dataclass(frozen=True)
class _EndpointDied:
    error: BaseException | None
