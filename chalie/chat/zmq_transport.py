"""The ZeroMQ chat transport: a ROUTER on ``ipc://<home>/chat.sock``, optionally TCP with CURVE.

A client is a DEALER; each message is one msgpack frame of the chat
protocol. A client's first frame opens its session (answered by ``hello``
before the reply), so a session is keyed by the client's ZeroMQ identity.

Bounds, each tested: a frame past four times ``max_frame_bytes`` makes
libzmq drop the peer before we read it (``MAXMSGSIZE``); a smaller frame
past ``max_frame_bytes`` is answered ``oversized-frame``; at most
``max_clients`` sessions (a newcomer past that gets ``too-many-clients``);
a session's inbox and outbox are bounded, so a client that floods gets
``overloaded`` and one that never reads is dropped; a session silent for
``idle_timeout`` or whose peer is gone (``EHOSTUNREACH``) is forgotten.

The TCP socket is a CURVE server; a ZAP handler on the bridge's own
context admits only the configured client public keys. There is no TCP
without CURVE (the configuration refuses it).

Who a client is (docs/chat.rst): the owner by transport (the 0600 ipc socket is the OS
user; an authorized CURVE key is the operator's), unless its first frame is a ``hello``
carrying a token (:class:`~chalie.chat.protocol.Authenticate`). That token is checked as
the WebSocket checks one: unknown or revoked → ``unauthorized``, valid but not an owner's
(an agent's, a gateway's) → ``forbidden``, each a ``rejected`` frame with no session, and
logged with the token's id, never its secret; an owner token's session is that token's
principal.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from chalie.chat import protocol as p
from chalie.chat.session import ChatSession
from chalie.conversation.port import ConversationsPort
from chalie.gate.tokens import TokenInfo
from chalie.process.config import ChatConfig
from chalie.wire.principals import LOCAL_OWNER, Principal, may_chat

log = logging.getLogger("chalie.chat.zmq")

SOCKET_NAME: Final = "chat.sock"
TRANSPORT_FACTOR: Final = 4
INBOX_LIMIT: Final = 64
PEER_HWM: Final = 256
_RETRY_SEND: Final = 0.02
ZAP_DOMAIN: Final = "chalie-chat"
# Connections whose hello was refused, remembered so they stay refused (newest kept).
REFUSED_KEPT: Final = 4096


def socket_path(home: Path) -> Path:
    return home / SOCKET_NAME


def ipc_endpoint(home: Path) -> str:
    path = socket_path(home)
    if len(os.fsencode(path)) > 107:
        raise ValueError(f"data directory path too long for an ipc socket: {path}")
    return f"ipc://{path}"


class _Keys:
    """The ZAP credentials check: the client's CURVE public key is one we were given."""

    def __init__(self, keys: list[str]) -> None:
        self._keys = frozenset(k.encode("ascii") for k in keys)

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = key in self._keys
        if not allowed:
            log.warning("chat CURVE client refused: unknown public key")
        return allowed


@dataclass(eq=False)
class _Peer:
    sock: zmq.asyncio.Socket
    ident: bytes
    session: ChatSession
    inbox: asyncio.Queue[bytes] = field(default_factory=lambda: asyncio.Queue(INBOX_LIMIT))
    last_seen: float = field(default_factory=time.monotonic)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class ZmqBridge:
    """The chat ROUTER socket(s) on the running event loop."""

    def __init__(
        self,
        config: ChatConfig,
        port: ConversationsPort,
        home: Path,
        verify: Callable[[str | None], Awaitable[TokenInfo | None]] | None = None,
    ) -> None:
        self._config = config
        self._verify = verify
        self._port = port
        self._home = home
        self._ctx = zmq.asyncio.Context()
        self._auth: AsyncioAuthenticator | None = None
        self._socks: list[zmq.asyncio.Socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._peers: dict[tuple[int, bytes], _Peer] = {}
        # connection -> the refusal its hello got: every later frame gets it again
        self._refused: OrderedDict[tuple[int, bytes], p.Rejected] = OrderedDict()
        # Sessions ever opened (clients counts only those still held).
        self.sessions_opened = 0
        self._inode: int | None = None
        self.tcp_endpoint: str | None = None

    @property
    def clients(self) -> int:
        return len(self._peers)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return self._tasks

    def _router(self) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, PEER_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, self._config.max_frame_bytes * TRANSPORT_FACTOR)
        return sock

    async def start(self) -> None:
        cfg = self._config
        loop = asyncio.get_running_loop()
        path = socket_path(self._home)
        ipc = self._router()
        self._socks.append(ipc)
        path.unlink(missing_ok=True)  # a stale file from a killed daemon; the daemon holds the lock
        ipc.bind(ipc_endpoint(self._home))
        os.chmod(path, 0o600)
        self._inode = os.stat(path).st_ino
        if cfg.zmq_tcp is not None:
            self._socks.append(self._curve_router(cfg))
        for index, sock in enumerate(self._socks):
            self._tasks.append(loop.create_task(self._serve(index, sock), name=f"chat-zmq-{index}"))
        self._tasks.append(loop.create_task(self._reap(), name="chat-zmq-reaper"))
        log.info("chat ZeroMQ listening", extra={"socket": str(path), "tcp": self.tcp_endpoint})

    def _curve_router(self, cfg: ChatConfig) -> zmq.asyncio.Socket:
        import zmq.auth

        assert cfg.curve_secret_key_file is not None and cfg.zmq_tcp is not None
        public, secret = zmq.auth.load_certificate(cfg.curve_secret_key_file)
        if secret is None:
            raise ValueError(f"{cfg.curve_secret_key_file} holds no secret key")
        self._auth = AsyncioAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, _Keys(cfg.curve_authorized_keys))
        sock = self._router()
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        sock.bind(cfg.zmq_tcp)
        self.tcp_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return sock

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for peer in list(self._peers.values()):
            await self._forget(peer, cancel_self=True)
        if self._auth is not None:
            self._auth.stop()
        for sock in self._socks:
            sock.close(0)
        self._ctx.term()
        path = socket_path(self._home)
        with contextlib.suppress(FileNotFoundError):
            if self._inode is not None and os.stat(path).st_ino == self._inode:
                path.unlink()

    # -- receiving ----------------------------------------------------------------------
    async def _serve(self, index: int, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) < 2:
                continue  # no identity and body: nobody to answer
            ident = frames[0]
            if len(frames) != 2:
                self._send_now(
                    sock, ident, p.Rejected(code=p.MALFORMED, message="a message is one frame")
                )
                continue
            peer = self._peers.get((index, ident))
            if peer is None:
                refused = self._refused.get((index, ident))
                if refused is not None:
                    self._send_now(sock, ident, refused)
                    continue
                hello = _authenticate(frames[1])
                principal: Principal = LOCAL_OWNER
                origin = "zmq:tcp" if index else "zmq:ipc"
                if hello is not None:
                    checked, origin = await self._check(sock, ident, hello, origin)
                    if isinstance(checked, p.Rejected):
                        self._send_now(sock, ident, checked)
                        self._refused[(index, ident)] = checked
                        while len(self._refused) > REFUSED_KEPT:
                            self._refused.popitem(last=False)
                        continue
                    principal = checked
                peer = self._admit(index, sock, ident, principal, origin)
                if peer is None or hello is not None:
                    continue  # the hello was the session's opening, not a frame for it
            peer.last_seen = time.monotonic()
            try:
                peer.inbox.put_nowait(frames[1])
            except asyncio.QueueFull:
                peer.session.push(
                    p.Rejected(code="overloaded", message="too many frames in flight; slow down")
                )

    async def _check(
        self, sock: zmq.asyncio.Socket, ident: bytes, hello: p.Authenticate, origin: str
    ) -> tuple[Principal | p.Rejected, str]:
        """The principal a hello's token speaks for, or the refusal to send."""
        info = await self._verify(hello.token) if self._verify is not None else None
        if info is None:
            log.warning("chat ZeroMQ client refused: not a valid token", extra={"origin": origin})
            return p.Rejected(code=p.UNAUTHORIZED, message="not a valid chat token"), origin
        principal = info.principal()
        if not may_chat(principal):
            log.warning(
                "chat ZeroMQ client refused a token that is not an owner's",
                extra={"token_id": info.id, "scope": info.scope, "origin": origin},
            )
            message = f"a {info.scope} token cannot chat; chat needs an owner token"
            return p.Rejected(code=p.FORBIDDEN, message=message), origin
        return principal, f"{origin}:{info.name}"

    def _admit(
        self,
        index: int,
        sock: zmq.asyncio.Socket,
        ident: bytes,
        principal: Principal = LOCAL_OWNER,
        origin: str = "zmq:ipc",
    ) -> _Peer | None:
        cfg = self._config
        if len(self._peers) >= cfg.max_clients:
            self._send_now(
                sock,
                ident,
                p.Rejected(code=p.TOO_MANY, message=f"at most {cfg.max_clients} clients"),
            )
            return None
        holder: list[_Peer] = []

        def overflow() -> None:
            if holder:
                asyncio.get_running_loop().create_task(self._forget(holder[0]))

        session = ChatSession(
            self._port,
            p.Codec("msgpack", cfg.max_frame_bytes),
            origin=origin,
            # The ipc socket is 0600 (the OS user); TCP admits only the operator's CURVE keys;
            # a hello's owner token is that token's principal (the module doc).
            principal=principal,
            outbox_limit=cfg.send_queue,
            max_open=cfg.max_open_conversations,
            on_overflow=overflow,
        )
        peer = _Peer(sock, ident, session)
        holder.append(peer)
        self._peers[(index, ident)] = peer
        self.sessions_opened += 1
        loop = asyncio.get_running_loop()
        peer.tasks = [loop.create_task(self._handle(peer)), loop.create_task(self._write(peer))]
        session.hello()
        return peer

    async def _handle(self, peer: _Peer) -> None:
        while True:
            raw = await peer.inbox.get()
            await peer.session.handle(raw)

    # -- sending ------------------------------------------------------------------------
    def _send_now(self, sock: zmq.asyncio.Socket, ident: bytes, frame: p.Rejected) -> None:
        with contextlib.suppress(zmq.ZMQError):
            sock.send_multipart([ident, p.Codec("msgpack", 0).encode(frame)], flags=zmq.NOBLOCK)

    async def _write(self, peer: _Peer) -> None:
        while True:
            frame = await peer.session.outbox.get()
            while True:
                try:
                    await peer.sock.send_multipart([peer.ident, frame], flags=zmq.NOBLOCK)
                    break
                except zmq.Again:
                    # The peer's pipe is full: it does not read. Its outbox keeps
                    # filling meanwhile and drops it when full.
                    await asyncio.sleep(_RETRY_SEND)
                except zmq.ZMQError as exc:
                    if exc.errno == errno.EHOSTUNREACH:
                        await self._forget(peer, cancel_self=False)
                        return
                    raise

    async def _forget(self, peer: _Peer, *, cancel_self: bool = True) -> None:
        for key, known in list(self._peers.items()):
            if known is peer:
                del self._peers[key]
        peer.session.close()
        me = asyncio.current_task()
        for task in peer.tasks:
            if task is not me or cancel_self:
                task.cancel()

    async def _reap(self) -> None:
        every = min(30.0, self._config.idle_timeout / 4)
        while True:
            await asyncio.sleep(every)
            cutoff = time.monotonic() - self._config.idle_timeout
            for peer in [x for x in self._peers.values() if x.last_seen < cutoff]:
                log.info(
                    "chat ZeroMQ client idle; forgotten", extra={"origin": peer.session.origin}
                )
                await self._forget(peer)


_hello = msgspec.msgpack.Decoder(p.Authenticate)


def _authenticate(raw: bytes) -> p.Authenticate | None:
    """A first frame that is a ``hello`` with a token (anything else: None)."""
    try:
        return _hello.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
