"""The ChatBridge actor: starts the WebSocket and ZeroMQ chat transports on the loop; stops them.

Lifecycle, in order:

1. ``on_start`` opens the token store and, when no token exists at all,
   writes the first one to ``<home>/first-token`` (0600) and logs where.
2. It starts both transports on the daemon's :class:`~actors.loop.EventLoopThread`;
   a bind failure fails the start (the supervisor sees it).
3. If a transport stops serving on its own, the actor fails, and the
   supervisor restarts it (new sockets, same token store).
4. ``on_stop`` closes every client session, both sockets and the store.

The transports reach the conversations service (seam #3) through
:class:`ActorConversations`, which turns each pykka future into an awaitable
without blocking the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import pykka

from actors.loop import EventLoopThread
from actors.serving import ServingActor
from actors.supervisor import ChildRef, ChildSpec, ChildUnavailable
from chalie.chat import protocol as p
from chalie.chat.router import ZmqBridge
from chalie.chat.session import AcceptedLike, Closable, ConversationsUnavailable, Refused
from chalie.chat.websocket import WebSocketBridge
from chalie.config import ChatConfig
from chalie.events import EventBus
from chalie.tokens import TokenInfo, TokenStore, ensure_first_token

log = logging.getLogger("chalie.chat")

CALL_TIMEOUT: Final = 10.0
START_TIMEOUT: Final = 10.0
WAITER_THREADS: Final = 16

# Builds the conversations service's SendMessage from the frame's fields (seam #3).
SendMessageFactory = Callable[..., Any]
ConversationsRef = Callable[[], pykka.ActorRef[Any]]


class ActorConversations:
    """The sessions' :class:`~chalie.chat.session.ConversationsPort` over the Conversations."""

    def __init__(
        self,
        conversations: ConversationsRef,
        events: EventBus,
        send_message: SendMessageFactory,
        *,
        timeout: float = CALL_TIMEOUT,
    ) -> None:
        self._resolve = conversations
        self._events = events
        self._send_message = send_message
        self._timeout = timeout
        self._proxy: tuple[pykka.ActorRef[Any], Any] | None = None
        self._waiters = concurrent.futures.ThreadPoolExecutor(
            WAITER_THREADS, thread_name_prefix="chalie-chat-wait"
        )

    def close(self) -> None:
        self._waiters.shutdown(wait=False, cancel_futures=True)

    async def send(self, frame: p.Send, origin: str) -> AcceptedLike:
        msg = self._send_message(
            conversation_id=frame.conversation_id,
            channel=frame.channel,
            text=frame.text,
            client_msg_id=frame.client_msg_id,
            busy=frame.busy,
            origin=origin,
        )
        accepted: AcceptedLike = await self._call("send", msg)
        return accepted

    async def cancel(self, conversation_id: str) -> bool:
        return bool(await self._call("cancel", conversation_id))

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> Sequence[Any]:
        found: Sequence[Any] = await self._call("events", conversation_id, after_seq, limit)
        return found

    async def answer(self, request_id: str, answer: str) -> bool:
        return await self._call("answer", request_id, answer) is not False

    def subscribe(self, conversation_id: str, callback: Callable[[Any], None]) -> Closable:
        return self._events.subscribe(conversation_id, callback)

    def _actor(self) -> Any:
        ref = self._resolve()
        cached = self._proxy
        if cached is None or cached[0] is not ref:
            cached = (ref, ref.proxy())  # building a proxy introspects: once per incarnation
            self._proxy = cached
        return cached[1]

    def _blocking_call(self, method: str, args: tuple[Any, ...]) -> Any:
        """On a waiter thread: resolving the child may ask the supervisor, and a pykka
        future has no callback, so the loop never runs this itself."""
        try:
            value: Any = getattr(self._actor(), method)(*args)
            while isinstance(value, pykka.Future):  # an answer may be a future: follow it
                value = value.get(timeout=self._timeout)
        except ChildUnavailable as exc:
            raise ConversationsUnavailable(str(exc)) from None
        except pykka.ActorDeadError:
            raise ConversationsUnavailable("the conversations service is restarting") from None
        except pykka.Timeout:
            raise ConversationsUnavailable(
                f"the conversations service did not answer {method} in {self._timeout:g} s"
            ) from None
        except ValueError as exc:
            code = getattr(exc, "code", None)
            if isinstance(code, str):  # the service refused the request (ConversationError)
                raise Refused(code, str(exc)) from None
            raise
        return value

    async def _call(self, method: str, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._waiters, self._blocking_call, method, args)
        except RuntimeError as exc:  # the waiter pool is shut down: the bridge is stopping
            raise ConversationsUnavailable(f"the chat bridge is stopping ({exc})") from None


class ChatBridge(ServingActor):
    """The tree's child for the chat transports."""

    def __init__(
        self,
        config: ChatConfig,
        home: Path,
        db_path: Path,
        loop: EventLoopThread,
        events: EventBus,
        conversations: ConversationsRef,
        send_message: SendMessageFactory,
    ) -> None:
        super().__init__()
        self._config = config
        self._home = home
        self._db_path = db_path
        self._loop = loop
        self._port = ActorConversations(conversations, events, send_message)
        self._tokens: TokenStore | None = None
        self._ws: WebSocketBridge | None = None
        self._zmq: ZmqBridge | None = None
        self._stopping = False

    def on_start(self) -> None:
        self._tokens = TokenStore(self._db_path)
        written = ensure_first_token(self._tokens, self._home)
        if written is not None:
            log.warning(
                "no chat token existed: one was created and written once to a 0600 file",
                extra={"path": str(written)},
            )
        self._loop.submit(self._start_transports()).result(START_TIMEOUT)

    async def _start_transports(self) -> None:
        if self._config.websocket:
            ws = WebSocketBridge(self._config, self._port, self._verify)
            try:
                await ws.start()
            except OSError as exc:
                # Another program holds the port: the local ZeroMQ chat still serves.
                log.error(
                    "chat WebSocket cannot listen; serving ZeroMQ chat only: %s",
                    exc.strerror or exc,
                    extra={"host": self._config.host, "port": self._config.port},
                )
            else:
                self._ws = ws
                self._watch(ws.task)
        self._zmq = ZmqBridge(self._config, self._port, self._home)
        await self._zmq.start()
        for task in self._zmq.tasks:
            self._watch(task)

    def _watch(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            task.add_done_callback(self._transport_ended)

    def _transport_ended(self, task: asyncio.Task[Any]) -> None:
        error = None if task.cancelled() else task.exception()
        if self._stopping:
            return
        log.error("chat transport stopped serving: %r", error)
        self.stopped_serving(repr(error))

    async def _verify(self, secret: str | None) -> TokenInfo | None:
        store = self._tokens
        if store is None or secret is None:
            return None
        # SQLite may wait on another writer: never on the loop thread.
        return await asyncio.get_running_loop().run_in_executor(None, store.verify, secret)

    def addresses(self) -> dict[str, Any]:
        """Where the transports listen (the WebSocket port is resolved when configured 0)."""
        ws = self._ws.address if self._ws is not None else None
        return {
            "websocket": None if ws is None else f"ws://{ws[0]}:{ws[1]}{self._config.path}",
            "zmq_tcp": self._zmq.tcp_endpoint if self._zmq is not None else None,
            "websocket_clients": self._ws.clients if self._ws is not None else 0,
            "zmq_clients": self._zmq.clients if self._zmq is not None else 0,
            "zmq_sessions_opened": self._zmq.sessions_opened if self._zmq is not None else 0,
        }

    def close(self) -> None:
        self._stopping = True
        if self._loop.is_alive():
            try:
                self._loop.submit(self._stop_transports()).result(START_TIMEOUT)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                log.error("chat transports did not stop: %s", exc)
        self._port.close()
        if self._tokens is not None:
            self._tokens.close()
            self._tokens = None

    async def _stop_transports(self) -> None:
        if self._ws is not None:
            await self._ws.stop()
        if self._zmq is not None:
            await self._zmq.stop()


def child_specs(
    config: ChatConfig,
    home: Path,
    db_path: Path,
    loop: EventLoopThread,
    events: EventBus,
    conversations: ChildRef[Any],
) -> list[ChildSpec]:
    """The chat bridge's place in the tree (after the conversations), or none when disabled."""
    from chalie.conversation.requests import SendMessage

    if not config.enabled:
        return []
    return [
        ChildSpec(
            "chat",
            lambda: ChatBridge.start(
                config, home, db_path, loop, events, conversations.current, SendMessage
            ),
            shutdown=10.0,
        )
    ]
