"""The WebSocket chat bridge: auth before accept (a real 401), Origin allow-list, frames, limits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from chalie.chat import protocol as p
from chalie.gate.tokens import TokenStore
from tests.core.chat.bridge import Bridge, start_bridge, stop_bridge
from tools.waiting import wait_until


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def frames_until(
    ws: ClientConnection, kind: str, timeout: float = 10.0
) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        got.append(frame)
        if frame["type"] == kind:
            return got


def status_of(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    async def go() -> tuple[int, dict[str, Any]]:
        with pytest.raises(InvalidStatus) as err:
            async with connect(url, **kwargs):
                pass
        response = err.value.response
        return response.status_code, json.loads(response.body or b"{}")

    return asyncio.run(go())


def test_a_message_over_websocket_streams_its_turn(bridge: Bridge) -> None:
    async def go() -> list[dict[str, Any]]:
        async with connect(bridge.ws_url, additional_headers=auth(bridge.token)) as ws:
            await ws.send(
                json.dumps({"type": "send", "text": "hi", "client_msg_id": "w1", "id": "1"})
            )
            return await frames_until(ws, "turn_finished")

    frames = asyncio.run(go())
    assert [f["type"] for f in frames[:2]] == ["hello", "accepted"]
    assert frames[-1]["text"] == "echo: hi"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer " + "x" * 5000},
    ],
)
def test_no_valid_token_is_a_real_401_before_accept(
    bridge: Bridge, headers: dict[str, str]
) -> None:
    status, body = status_of(bridge.ws_url, additional_headers=headers)
    assert status == 401 and body["code"] == p.UNAUTHORIZED


def test_a_revoked_token_is_refused_at_the_next_connection(bridge: Bridge) -> None:
    with TokenStore(bridge.home / "chalie.db") as store:
        secret = store.create("tablet", scope="owner")
        store.revoke("tablet")
    assert status_of(bridge.ws_url, additional_headers=auth(secret))[0] == 401


def test_a_browser_may_send_the_token_as_a_subprotocol(bridge: Bridge) -> None:
    async def go() -> str | None:
        async with connect(
            bridge.ws_url,
            subprotocols=["chalie", f"chalie.bearer.{bridge.token}"],  # type: ignore[list-item]
        ) as ws:
            await frames_until(ws, "hello")
            return ws.subprotocol

    assert asyncio.run(go()) == "chalie"


def test_a_foreign_origin_is_refused_and_a_listed_one_admitted(short_home: Path) -> None:
    b = start_bridge(short_home, origins=["http://127.0.0.1:3000"])
    try:
        status, body = status_of(
            b.ws_url,
            additional_headers=auth(b.token),
            origin="http://evil.example",  # type: ignore[arg-type]
        )
        assert status == 403 and body["code"] == p.ORIGIN_REFUSED

        async def go() -> None:
            origin = Origin("http://127.0.0.1:3000")
            async with connect(b.ws_url, additional_headers=auth(b.token), origin=origin) as ws:
                await frames_until(ws, "hello")

        asyncio.run(go())
    finally:
        stop_bridge(b)


def test_bad_and_oversized_frames_get_errors_and_the_session_goes_on(bridge: Bridge) -> None:
    cases = [
        ("{not json", p.MALFORMED),
        ("[]", p.MALFORMED),
        ('{"type": "warp"}', p.UNKNOWN_KIND),
        ('{"type": "send", "text": 5, "client_msg_id": "a"}', p.INVALID),
        ("x" * (300 * 1024), p.OVERSIZED),
    ]

    async def go() -> None:
        async with connect(
            bridge.ws_url, additional_headers=auth(bridge.token), max_size=None
        ) as ws:
            await frames_until(ws, "hello")
            for raw, code in cases:
                await ws.send(raw)
                assert (await frames_until(ws, "rejected"))[-1]["code"] == code
            await ws.send(b'{"type": "ping", "id": "bin"}')
            assert (await frames_until(ws, "pong"))[-1]["id"] == "bin"
            await ws.send(json.dumps({"type": "send", "text": "ok", "client_msg_id": "z"}))
            assert (await frames_until(ws, "turn_finished"))[-1]["text"] == "echo: ok"

    asyncio.run(go())


def test_a_frame_past_the_transport_limit_closes_only_that_connection(bridge: Bridge) -> None:
    async def go() -> None:
        async with (
            connect(bridge.ws_url, additional_headers=auth(bridge.token)) as fine,
            connect(bridge.ws_url, additional_headers=auth(bridge.token), max_size=None) as big,
        ):
            await big.send("x" * (2 * 1024 * 1024))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(big.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
            await fine.send(json.dumps({"type": "send", "text": "still", "client_msg_id": "s"}))
            assert (await frames_until(fine, "turn_finished"))[-1]["text"] == "echo: still"

    asyncio.run(go())


def test_a_websocket_client_that_never_reads_is_dropped(short_home: Path) -> None:
    b = start_bridge(short_home, send_queue=8)
    try:

        async def go() -> None:
            lazy = await connect(b.ws_url, additional_headers=auth(b.token), max_queue=1)
            lazy.transport.pause_reading()  # never read again: the kernel buffers fill
            await lazy.send(
                json.dumps({"type": "send", "text": "flood 5000", "client_msg_id": "f"})
            )
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: wait_until(lambda: b.addresses()["websocket_clients"] == 0, 30)
            )
            async with connect(b.ws_url, additional_headers=auth(b.token)) as fine:
                await fine.send(json.dumps({"type": "send", "text": "here", "client_msg_id": "h"}))
                assert (await frames_until(fine, "turn_finished"))[-1]["text"] == "echo: here"
            lazy.transport.abort()

        asyncio.run(go())
    finally:
        stop_bridge(b)


def test_past_max_clients_a_newcomer_gets_503(short_home: Path) -> None:
    b = start_bridge(short_home, max_clients=3)
    try:

        async def go() -> None:
            held = [await connect(b.ws_url, additional_headers=auth(b.token)) for _ in range(3)]
            for ws in held:
                await frames_until(ws, "hello")
            with pytest.raises(InvalidStatus) as err:
                async with connect(b.ws_url, additional_headers=auth(b.token)):
                    pass
            assert err.value.response.status_code == 503
            for ws in held:
                await ws.close()

        asyncio.run(go())
    finally:
        stop_bridge(b)


@pytest.mark.slow
def test_a_thousand_websocket_connections_and_the_daemon_still_answers(short_home: Path) -> None:
    # Upgraded clients count against the listener's connection cap (chalie.net.admission).
    b = start_bridge(short_home, max_connections=1200)
    try:

        async def go() -> None:
            held: list[ClientConnection] = []
            for _ in range(10):
                batch = await asyncio.gather(
                    *(connect(b.ws_url, additional_headers=auth(b.token)) for _ in range(100))
                )
                held.extend(batch)
            assert b.addresses()["websocket_clients"] == 1000
            await held[500].send(json.dumps({"type": "send", "text": "many", "client_msg_id": "m"}))
            assert (await frames_until(held[500], "turn_finished", 30))[-1]["text"] == "echo: many"
            await asyncio.gather(*(ws.close() for ws in held))

        asyncio.run(go())
        wait_until(lambda: b.addresses()["websocket_clients"] == 0, 30)
    finally:
        stop_bridge(b)


def test_a_connection_whose_token_is_revoked_is_closed(short_home: Path) -> None:
    b = start_bridge(short_home, token_recheck=0.05)
    try:
        with TokenStore(b.home / "chalie.db") as store:
            secret = store.create("laptop", scope="owner")

        async def go() -> int | None:
            async with connect(b.ws_url, additional_headers=auth(secret)) as ws:
                await frames_until(ws, "hello")
                with TokenStore(b.home / "chalie.db") as store:
                    assert store.revoke("laptop")
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await asyncio.wait_for(ws.recv(), 10)
                return closed.value.rcvd.code if closed.value.rcvd else None

        assert asyncio.run(go()) == 4401
    finally:
        stop_bridge(b)


@pytest.mark.parametrize("scope", ["agent", "gateway"])
def test_an_agent_token_is_a_real_403_before_accept_and_logged_without_it(
    bridge: Bridge, scope: str, caplog: pytest.LogCaptureFixture
) -> None:
    with TokenStore(bridge.home / "chalie.db") as store:
        secret = store.create(f"agent-{scope}", scope=scope)  # type: ignore[arg-type]
    status, body = status_of(bridge.ws_url, additional_headers=auth(secret))
    assert status == 403 and body["code"] == p.FORBIDDEN
    # Nor as a browser would offer it.
    status, body = status_of(
        bridge.ws_url,
        subprotocols=["chalie", f"chalie.bearer.{secret}"],  # type: ignore[list-item]
    )
    assert status == 403 and body["code"] == p.FORBIDDEN
    refusals = [r for r in caplog.records if "not an owner" in r.getMessage()]
    assert refusals and all(secret not in str(r.__dict__) for r in caplog.records)


def test_the_bearer_scheme_is_case_insensitive(bridge: Bridge) -> None:
    async def go() -> None:
        headers = {"Authorization": f"bEARER {bridge.token}"}
        async with connect(bridge.ws_url, additional_headers=headers) as ws:
            await frames_until(ws, "hello")

    asyncio.run(go())


def test_offering_only_the_token_subprotocol_gets_a_real_http_answer(bridge: Bridge) -> None:
    status, body = status_of(
        bridge.ws_url,
        subprotocols=[f"chalie.bearer.{bridge.token}"],  # type: ignore[list-item]
    )
    assert status == 400 and body["code"] == p.INVALID and "'chalie'" in body["message"]


def test_a_frame_nested_100000_deep_is_malformed_and_the_session_goes_on(bridge: Bridge) -> None:
    async def go() -> list[dict[str, Any]]:
        async with connect(
            bridge.ws_url, additional_headers=auth(bridge.token), max_size=None
        ) as ws:
            await frames_until(ws, "hello")
            await ws.send("[" * 100_000 + "]" * 100_000)
            first = await frames_until(ws, "rejected")
            await ws.send('{"type": "ping", "id": "after", "x": ' + "[" * 5000 + "]" * 5000 + "}")
            second = await frames_until(ws, "rejected")
            await ws.send(json.dumps({"type": "ping", "id": "still"}))
            return [*first, *second, *(await frames_until(ws, "pong"))]

    frames = asyncio.run(go())
    rejected = [f for f in frames if f["type"] == "rejected"]
    assert [f["code"] for f in rejected] == [p.MALFORMED, p.MALFORMED]
    assert frames[-1] == {"type": "pong", "id": "still"}
