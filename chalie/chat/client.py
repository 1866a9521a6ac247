"""A client of the ZeroMQ chat bridge: a DEALER socket speaking the chat protocol in msgpack.

Used by ``chalie chat`` and by tests; one thread owns one client. Frames
from the daemon come back as plain mappings (``{"type": ..., ...}``), so a
client built against an older protocol still reads newer event kinds.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import zmq

from chalie.chat import protocol as p
from chalie.chat.zmq_transport import ipc_endpoint, socket_path

Frame = dict[str, Any]

_encoder = msgspec.msgpack.Encoder()


class ChatUnavailable(RuntimeError):
    """No chat bridge answers."""


class ChatClient:
    """One DEALER connection to the daemon's chat bridge."""

    def __init__(
        self,
        endpoint: str,
        *,
        curve: tuple[bytes, bytes, bytes] | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        """``curve``: (server public key, client public key, client secret key), Z85."""
        self.endpoint = endpoint
        self._ctx = context or zmq.Context.instance()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, uuid.uuid4().bytes)
        if curve is not None:
            server_public, public, secret = curve
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.connect(endpoint)
        self.sock = sock

    @classmethod
    def local(cls, home: Path) -> ChatClient:
        if not socket_path(home).exists():
            raise ChatUnavailable(f"no chat socket in {home} (is the daemon running?)")
        return cls(ipc_endpoint(home))

    def close(self) -> None:
        self.sock.close(0)

    def leave(self, wait: float = 1.0) -> None:
        """Say ``bye`` (the daemon stops counting this client as present) and close, once
        its ``pong`` came or after ``wait`` seconds (a process that exits at once would
        otherwise lose the frame with its ZeroMQ thread)."""
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send(_encoder.encode(p.Bye(id="bye")), flags=zmq.NOBLOCK)
            deadline = time.monotonic() + wait
            while (left := deadline - time.monotonic()) > 0:
                frame = self.receive(left)
                if frame is None or (frame.get("type") == "pong" and frame.get("id") == "bye"):
                    break
        self.sock.close(0)

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, frame: p.ClientFrame) -> None:
        self.sock.send(_encoder.encode(frame))

    def send_raw(self, *parts: bytes) -> None:
        self.sock.send_multipart(list(parts))

    def receive(self, timeout: float) -> Frame | None:
        """The next frame from the daemon, or None after ``timeout`` seconds."""
        if not self.sock.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        raw = self.sock.recv()
        try:
            frame = msgspec.msgpack.decode(raw)
        except msgspec.DecodeError:
            return {"type": "rejected", "code": p.MALFORMED, "message": "unreadable frame"}
        if not isinstance(frame, dict):
            return {"type": "rejected", "code": p.MALFORMED, "message": "frame is not a map"}
        return frame
