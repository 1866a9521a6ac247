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
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from chalie.chat import protocol as p
from chalie.chat.session import ChatSession
from chalie.config import ChatConfig
from chalie.conversation.port import ConversationsPort
from chalie.principals import LOCAL_OWNER

log = logging.getLogger("chalie.chat.zmq")

SOCKET_NAME: Final = "chat.sock"
TRANSPORT_FACTOR: Final = 4
INBOX_LIMIT: Final = 64
PEER_HWM: Final = 256
_RETRY_SEND: Final = 0.02
ZAP_DOMAIN: Final = "chalie-chat"


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

    def __init__(self, config: ChatConfig, port: ConversationsPort, home: Path) -> None:
        self._config = config
        self._port = port
        self._home = home
        self._ctx = zmq.asyncio.Context()
        self._auth: AsyncioAuthenticator | None = None
        self._socks: list[zmq.asyncio.Socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._peers: dict[tuple[int, bytes], _Peer] = {}
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
                peer = self._admit(index, sock, ident)
                if peer is None:
                    continue
            peer.last_seen = time.monotonic()
            try:
                peer.inbox.put_nowait(frames[1])
            except asyncio.QueueFull:
                peer.session.push(
                    p.Rejected(code="overloaded", message="too many frames in flight; slow down")
                )

    def _admit(self, index: int, sock: zmq.asyncio.Socket, ident: bytes) -> _Peer | None:
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
            origin="zmq:tcp" if index else "zmq:ipc",
            # The ipc socket is 0600 (the OS user); TCP admits only the operator's CURVE keys.
            principal=LOCAL_OWNER,
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
