"""Our uvicorn server stops on events: on a loop whose clock stands still it still stops.

On :class:`StillClock` no timer ever fires (``asyncio.sleep(0.1)``, a timeout), while I/O
and callbacks run as usual. uvicorn's own server sleeps 0.1 s in its main loop and in its
shutdown, so it would never stop there; ours must, and must still finish what it owes
(a request in flight gets its whole response; an idle keep-alive connection is closed).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from chalie.net.asgi_server import Server
from chalie.net.listener import tcp_listener

GUARD = 30.0  # seconds of real time before the test gives up on a server that never stops


class StillClock(asyncio.SelectorEventLoop):
    """An event loop whose clock never moves: its timers never fire."""

    def time(self) -> float:
        return 1000.0


def run_still(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``scenario`` on a still-clock loop in a thread; fail if it has not ended in GUARD s."""
    loop = StillClock()
    outcome: dict[str, Any] = {}
    task: asyncio.Task[Any] | None = None

    def run() -> None:
        nonlocal task
        asyncio.set_event_loop(loop)

        async def main() -> Any:
            return await scenario()

        task = loop.create_task(main())
        try:
            outcome["value"] = loop.run_until_complete(task)
        except BaseException as exc:  # reported to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD)
    stuck = thread.is_alive()
    if stuck and task is not None:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(GUARD)
    if not thread.is_alive():
        loop.close()
    assert not stuck, "the server did not stop while the clock stood still (it waits on a clock)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def app_with(release: asyncio.Event | None) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if release is not None:
            await send({"type": "http.response.body", "body": b"part one,", "more_body": True})
            await release.wait()
        await send({"type": "http.response.body", "body": b"done"})

    return app


async def started(release: asyncio.Event | None = None) -> tuple[Server, asyncio.Task[None], int]:
    sock = tcp_listener("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(app_with(release), lifespan="off", log_config=None, http="h11")
    server = Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), task
        await asyncio.sleep(0)  # a yield, not a timer
    return server, task, port


async def get(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    await writer.drain()
    return reader, writer


def test_an_idle_server_stops_at_once_when_asked_and_closes_its_keep_alive_connections() -> None:
    async def scenario() -> bytes:
        server, task, port = await started()
        reader, writer = await get(port)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        server.exit()
        await task  # the main loop woke and the shutdown ended without a tick
        rest = await reader.read()  # the server closed the kept-alive connection
        writer.close()
        return rest

    assert b"done" in run_still(scenario)


def test_a_request_in_flight_at_the_stop_gets_its_whole_response_then_the_server_is_gone() -> None:
    async def scenario() -> tuple[bytes, bool]:
        release = asyncio.Event()
        server, task, port = await started(release)
        reader, writer = await get(port)
        await reader.readuntil(b"part one,")
        server.exit()
        for _ in range(50):
            await asyncio.sleep(0)
        still_serving = not task.done()  # the shutdown waits for the request
        release.set()
        await task  # woken by the request's end, not by a clock
        body = await reader.read()
        writer.close()
        return body, still_serving

    body, still_serving = run_still(scenario)
    assert still_serving
    assert b"done" in body


def test_exit_from_another_thread_wakes_the_server() -> None:
    async def scenario() -> None:
        server, task, _port = await started()
        thread = threading.Thread(target=server.exit)
        thread.start()
        await task
        thread.join()

    run_still(scenario)
