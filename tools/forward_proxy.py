"""A forward HTTP proxy on loopback for tests: absolute-form requests and CONNECT tunnels.

Every origin it is asked for goes to one ``upstream`` (host, port) whatever the name,
so a test can name a model server ``model.invalid`` (no resolver knows it) and still
reach one on loopback, through the proxy only. ``seen`` lists each request line.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class ForwardProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.seen: list[str] = []
        self.authorizations: list[str | None] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    def __enter__(self) -> ForwardProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            self.seen.append(lines[0])
            auth = [
                v
                for k, _, v in (x.partition(": ") for x in lines[1:])
                if k.lower() == "proxy-authorization"
            ]
            self.authorizations.append(auth[0] if auth else None)
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            if lines[0].startswith("CONNECT "):
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                method, target, version = lines[0].split(" ", 2)
                path = "/" + target.split("://", 1)[1].split("/", 1)[1]
                kept = [x for x in lines[1:] if not x.lower().startswith("proxy-")]
                up_writer.write(
                    ("\r\n".join([f"{method} {path} {version}", *kept])).encode("latin-1")
                )
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, IndexError, ValueError):
            pass
        finally:
            writer.close()
            if up_writer is not None:
                up_writer.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: Any) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
