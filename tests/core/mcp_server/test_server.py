"""The inbound MCP server end to end: the official SDK client over loopback, both protocol modes.

The conversations seam is the in-process double (tests/core/mcp_server/doubles.py);
the token store is the real one on a real SQLite file.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.conversations_double import DoublePort
from tests.core.mcp_server.harness import MODES, Running, connect, running
from tools.waiting import wait_until

# Starts an MCP HTTP server with the SDK client: deselect with -m "not slow".
pytestmark = pytest.mark.slow

ARGS: dict[str, Any] = {
    "message": "add 2 and 2",
    "agent_name": "claude-code",
    "project_or_task_name": "chalie",
}
ACCEPT = "application/json, text/event-stream"


def initialize_body(version: str = "2025-11-25") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }


def raw_post(
    r: Running, body: Any = None, *, content: bytes | None = None, **headers: str
) -> httpx2.Response:
    base = {"accept": ACCEPT, "content-type": "application/json"}
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    with httpx2.Client(timeout=10) as http:
        if content is not None:
            return http.post(r.url, content=content, headers=base)
        return http.post(r.url, json=body, headers=base)


@pytest.mark.parametrize("mode", MODES)
def test_a_full_exchange_reports_progress_and_says_what_was_denied(mode: str) -> None:
    with running() as r:
        secret = r.tokens.create("coder")
        progress: list[str] = []

        async def on_progress(_p: float, _t: float | None, message: str | None) -> None:
            progress.append(message or "")

        async def go() -> Any:
            async with connect(r.url, secret, mode) as client:
                listed = await client.list_tools()
                assert [t.name for t in listed.tools] == ["talk_to_chalie"]
                return await client.call_tool(
                    "talk_to_chalie",
                    {**ARGS, "message": "add 2 and 2 then deny the email"},
                    progress_callback=on_progress,
                )

        result = asyncio.run(go())
        assert not result.is_error
        data = result.structured_content
        assert data["answer"].startswith("2+2 is 4.")
        assert data["could_not"] == [
            {
                "tool": "send_email",
                "code": "permission-denied",
                "why": "it needs a person's approval and no human is present "
                "on the external_agent channel",
            }
        ]
        text = result.content[0].text
        assert "Chalie could not run send_email" in text
        assert f"[conversation_id: {data['conversation_id']}]" in text
        assert progress == [
            "find_tools: looking for tools",
            "calculator: computing 2+2",
            "send_email: sending an email to bob",
        ]
        (sent,) = r.convs.sent
        assert sent.origin == "mcp:coder"
        assert sent.text.startswith("[agent: claude-code · project: chalie]\n")


@pytest.mark.parametrize("mode", MODES)
def test_an_exchange_continues_only_for_the_token_that_started_it(mode: str) -> None:
    with running() as r:
        mine, theirs = r.tokens.create("a1"), r.tokens.create("a2")

        async def go() -> tuple[Any, Any, Any]:
            async with connect(r.url, mine, mode) as client:
                first = await client.call_tool("talk_to_chalie", ARGS)
                cid = first.structured_content["conversation_id"]
                again = await client.call_tool("talk_to_chalie", {**ARGS, "conversation_id": cid})
            async with connect(r.url, theirs, mode) as client:
                stolen = await client.call_tool("talk_to_chalie", {**ARGS, "conversation_id": cid})
            return first, again, stolen

        first, again, stolen = asyncio.run(go())
        cid = first.structured_content["conversation_id"]
        assert again.structured_content["conversation_id"] == cid
        assert again.structured_content["turn_id"] != first.structured_content["turn_id"]
        assert stolen.is_error
        assert stolen.structured_content["error"]["code"] == "unknown-conversation"
        assert [s.conversation_id for s in r.convs.sent] == [cid, cid]


@pytest.mark.parametrize("mode", MODES)
def test_bad_arguments_come_back_itemised_and_start_no_turn(mode: str) -> None:
    with running() as r:
        secret = r.tokens.create("coder")

        async def go() -> Any:
            async with connect(r.url, secret, mode) as client:
                return await client.call_tool(
                    "talk_to_chalie",
                    {"message": "", "agent_name": "x" * 101, "project_or_task_name": "a\nb"},
                )

        result = asyncio.run(go())
        assert result.is_error
        error = result.structured_content["error"]
        assert error["code"] == "invalid-arguments"
        assert [f["field"] for f in error["fields"]] == [
            "message",
            "agent_name",
            "project_or_task_name",
        ]
        assert "3 bad fields" in result.content[0].text
        assert r.convs.sent == []


AUTH_CASES = {
    "missing": None,
    "malformed": "Basic dXNlcjpwYXNz",
    "unknown": "Bearer chalie_notatokenthatexists000000000000",
    "revoked": "revoked",
}


@pytest.mark.parametrize("case", list(AUTH_CASES))
def test_every_auth_failure_is_a_401_before_any_turn(case: str) -> None:
    with running() as r:
        header = AUTH_CASES[case]
        if header == "revoked":
            secret = r.tokens.create("gone")
            assert r.tokens.revoke("gone")
            header = f"Bearer {secret}"
        headers = {"authorization": header} if header else {}
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "talk_to_chalie", "arguments": ARGS},
        }
        for body in (initialize_body(), call):
            resp = raw_post(r, body, **headers)
            assert resp.status_code == 401
            assert resp.headers["www-authenticate"].startswith('Bearer realm="chalie"')
            assert resp.json()["error"]["data"]["code"] == "unauthorized"
        assert r.convs.sent == [] and r.talk.stats.calls == 0


@pytest.mark.parametrize("mode", MODES)
def test_the_sdk_client_sees_401_with_a_revoked_token(mode: str) -> None:
    with running() as r:
        secret = r.tokens.create("coder")
        r.tokens.revoke("coder")
        statuses: list[int] = []

        async def hook(response: httpx2.Response) -> None:
            statuses.append(response.status_code)

        async def go() -> None:
            headers = {"Authorization": f"Bearer {secret}"}
            async with httpx2.AsyncClient(headers=headers, event_hooks={"response": [hook]}) as h:
                from mcp.client import Client
                from mcp.client.streamable_http import streamable_http_client

                async with Client(streamable_http_client(r.url, http_client=h), mode=mode):  # type: ignore[arg-type]
                    pass

        with pytest.raises(BaseException):  # noqa: B017 - the SDK nests it in groups
            asyncio.run(go())
        assert statuses and set(statuses) == {401}
        assert r.convs.sent == []


def test_requests_past_the_per_minute_limit_get_429_with_retry_after() -> None:
    with running(requests_per_minute=5) as r:
        secret = r.tokens.create("busy")
        codes = [
            raw_post(r, initialize_body(), authorization=f"Bearer {secret}").status_code
            for _ in range(7)
        ]
        assert codes[:5] == [200] * 5 and codes[5:] == [429, 429]
        resp = raw_post(r, initialize_body(), authorization=f"Bearer {secret}")
        assert resp.status_code == 429 and int(resp.headers["retry-after"]) >= 1
        assert resp.json()["error"]["data"]["code"] == "rate-limited"
        other = r.tokens.create("calm")
        assert raw_post(r, initialize_body(), authorization=f"Bearer {other}").status_code == 200


@pytest.mark.parametrize("mode", MODES)
def test_turns_past_the_concurrent_limit_get_429_and_never_queue(mode: str) -> None:
    with running(max_concurrent_turns=1) as r:
        secret = r.tokens.create("one")
        statuses: list[int] = []

        async def hook(response: httpx2.Response) -> None:
            statuses.append(response.status_code)

        async def go() -> Any:
            from mcp.client import Client
            from mcp.client.streamable_http import streamable_http_client

            headers = {"Authorization": f"Bearer {secret}"}
            async with httpx2.AsyncClient(
                headers=headers, event_hooks={"response": [hook]}, timeout=30
            ) as h:
                async with Client(streamable_http_client(r.url, http_client=h), mode=mode) as c:  # type: ignore[arg-type]
                    hanging = asyncio.ensure_future(
                        c.call_tool("talk_to_chalie", {**ARGS, "message": "hang"})
                    )
                    await asyncio.to_thread(wait_until, lambda: len(r.convs.sent) == 1)
                    with pytest.raises(MCPError):
                        await c.call_tool("talk_to_chalie", ARGS)
                    hanging.cancel()
                    with pytest.raises(BaseException):  # noqa: B017
                        await hanging
                    await asyncio.to_thread(wait_until, lambda: len(r.convs.cancelled) == 1)
                    # The slot is free again once the first call ended.
                    await asyncio.to_thread(
                        wait_until, lambda: r.server.gate.limits.turns(_id(r, "one")) == 0
                    )  # type: ignore[union-attr]
                    return await c.call_tool("talk_to_chalie", ARGS)

        last = asyncio.run(go())
        assert 429 in statuses
        assert not last.is_error
        assert len(r.convs.sent) == 2  # the refused call never reached a turn


def test_an_oversized_body_gets_413_before_the_mcp_app() -> None:
    with running(max_body_bytes=4096) as r:
        secret = r.tokens.create("big")
        auth = f"Bearer {secret}"
        big = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "talk_to_chalie", "arguments": {**ARGS, "message": "x" * 10_000}},
        }
        resp = raw_post(r, big, authorization=auth)
        assert resp.status_code == 413
        assert resp.json()["error"]["data"]["code"] == "body-too-large"

        def chunks() -> Any:  # no Content-Length: refused as it streams
            for _ in range(10):
                yield b"x" * 1000

        with httpx2.Client(timeout=10) as http:
            streamed = http.post(
                r.url,
                content=chunks(),
                headers={
                    "authorization": auth,
                    "accept": ACCEPT,
                    "content-type": "application/json",
                },
            )
        assert streamed.status_code == 413
        assert r.convs.sent == []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b"null",
        b'{"jsonrpc": "2.0", "id": 1}',
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": 5}',
        b"\xff\xfe\x00garbage",
    ],
)
def test_malformed_json_rpc_gets_an_error_and_the_server_keeps_serving(content: bytes) -> None:
    with running() as r:
        secret = r.tokens.create("fuzz")
        auth = f"Bearer {secret}"
        resp = raw_post(r, content=content, authorization=auth)
        assert 400 <= resp.status_code < 500
        assert r.convs.sent == []
        assert raw_post(r, initialize_body(), authorization=auth).status_code == 200


def test_wrong_host_or_origin_is_refused() -> None:
    with running() as r:
        secret = r.tokens.create("web")
        auth = f"Bearer {secret}"
        assert (
            raw_post(r, initialize_body(), authorization=auth, host="evil.example").status_code
            == 421
        )
        assert (
            raw_post(r, initialize_body(), authorization=auth, host="localhost").status_code == 421
        )
        wrong_origin = raw_post(
            r, initialize_body(), authorization=auth, origin="http://evil.example"
        )
        assert wrong_origin.status_code == 403
        port = r.server.port
        good = raw_post(r, initialize_body(), authorization=auth, origin=f"http://localhost:{port}")
        assert good.status_code == 200


@pytest.mark.slow
def test_a_flood_of_sessions_is_bounded_and_the_server_keeps_serving() -> None:
    with running(max_sessions=20, requests_per_minute=10_000) as r:
        secret = r.tokens.create("flood")
        auth = f"Bearer {secret}"
        codes = [raw_post(r, initialize_body(), authorization=auth).status_code for _ in range(40)]
        assert codes.count(200) == 20
        assert set(codes) - {200} and all(c >= 400 for c in codes if c != 200)

        async def go() -> Any:  # the stateless generation needs no session
            async with connect(r.url, secret, "auto") as client:
                return await client.call_tool("talk_to_chalie", ARGS)

        assert not asyncio.run(go()).is_error


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_request_cancels_the_turn(mode: str) -> None:
    with running() as r:
        secret = r.tokens.create("quitter")

        async def go() -> None:
            async with connect(r.url, secret, mode) as client:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await client.call_tool("talk_to_chalie", {**ARGS, "message": "hang"})
                await asyncio.to_thread(wait_until, lambda: len(r.convs.cancelled) == 1)

        asyncio.run(go())
        assert r.convs.cancelled == [r.convs.sent[0].conversation_id]


def test_a_client_that_disconnects_cancels_the_turn() -> None:
    with running() as r:
        secret = r.tokens.create("dropper")
        auth = f"Bearer {secret}"
        init = raw_post(r, initialize_body(), authorization=auth)
        session = init.headers["mcp-session-id"]
        raw_post(
            r,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            authorization=auth,
            mcp_session_id=session,
            mcp_protocol_version="2025-11-25",
        )
        call = {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {"name": "talk_to_chalie", "arguments": {**ARGS, "message": "hang"}},
        }
        headers = {
            "authorization": auth,
            "accept": ACCEPT,
            "content-type": "application/json",
            "mcp-session-id": session,
            "mcp-protocol-version": "2025-11-25",
        }
        with httpx2.Client(timeout=10) as http:
            with http.stream("POST", r.url, json=call, headers=headers) as resp:
                assert resp.status_code == 200
                wait_until(lambda: len(r.convs.sent) == 1)
            # leaving the block closes the connection mid-response
        wait_until(lambda: len(r.convs.cancelled) == 1)
        assert r.talk.stats.cancelled == 1


@pytest.mark.parametrize("mode", MODES)
def test_loop_in_human_surfaces_the_exchange_to_connected_chat_clients(mode: str) -> None:
    with running() as r:
        secret = r.tokens.create("coder")

        async def go() -> Any:
            async with connect(r.url, secret, mode) as client:
                await client.call_tool("talk_to_chalie", ARGS)  # not surfaced
                return await client.call_tool(
                    "talk_to_chalie", {**ARGS, "loop_in_human": True, "message": "deny email"}
                )

        result = asyncio.run(go())
        asked, answered = r.desk.shown
        assert (asked.phase, answered.phase) == ("asked", "answered")
        for shown in (asked, answered):
            assert shown.agent_name == "claude-code" and shown.project == "chalie"
            assert shown.message == "deny email" and shown.token_name == "coder"
            assert shown.conversation_id == result.structured_content["conversation_id"]
        assert answered.answer == result.structured_content["answer"]


def test_a_slow_turn_keeps_reporting_progress_until_it_ends() -> None:
    with running(convs=DoublePort(step_delay=0.05)) as r:
        secret = r.tokens.create("patient")
        seen: list[float] = []

        async def on_progress(p: float, _t: float | None, _m: str | None) -> None:
            seen.append(p)

        async def go() -> Any:
            async with connect(r.url, secret, "auto") as client:
                return await client.call_tool("talk_to_chalie", ARGS, progress_callback=on_progress)

        assert not asyncio.run(go()).is_error
        assert seen == sorted(seen) and len(seen) == 2


def test_a_method_header_that_disagrees_with_the_body_does_not_dodge_the_turn_limit() -> None:
    with running(max_concurrent_turns=1, convs=DoublePort()) as r:
        secret = r.tokens.create("sly")
        auth = f"Bearer {secret}"
        r.server.gate.limits.begin_turn(_id(r, "sly"))  # type: ignore[union-attr]  # one turn running
        call = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "talk_to_chalie", "arguments": ARGS},
        }
        for header in ("tools/list", "ping"):
            resp = raw_post(r, call, authorization=auth, mcp_method=header)
            assert resp.status_code == 429
        assert r.convs.sent == []


def test_a_session_belongs_to_the_token_that_opened_it() -> None:
    with running() as r:
        owner, other = r.tokens.create("owner"), r.tokens.create("other")
        init = raw_post(r, initialize_body(), authorization=f"Bearer {owner}")
        session = init.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        versions = {"mcp_session_id": session, "mcp_protocol_version": "2025-11-25"}
        stolen = raw_post(r, listing, authorization=f"Bearer {other}", **versions)
        assert stolen.status_code == 404
        assert stolen.json()["error"]["data"]["code"] == "unknown-session"
        with httpx2.Client(timeout=10) as http:
            hijack = http.get(
                r.url,
                headers={
                    "authorization": f"Bearer {other}",
                    "accept": "text/event-stream",
                    "mcp-session-id": session,
                },
            )
        assert hijack.status_code == 404
        raw_post(
            r,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            authorization=f"Bearer {owner}",
            **versions,
        )
        mine = raw_post(r, listing, authorization=f"Bearer {owner}", **versions)
        assert mine.status_code == 200 and "talk_to_chalie" in mine.text


def test_a_request_cancelled_while_its_message_is_stored_still_cancels_the_turn() -> None:
    with running(convs=DoublePort(accept_delay=1.0)) as r:
        secret = r.tokens.create("hasty")

        async def go() -> None:
            async with connect(r.url, secret, "auto") as client:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await client.call_tool("talk_to_chalie", {**ARGS, "message": "hang"})

        asyncio.run(go())
        wait_until(lambda: len(r.convs.cancelled) == 1)
        assert r.convs.cancelled == [r.convs.sent[0].conversation_id]


def test_the_server_opens_no_opentelemetry_span_per_message() -> None:
    from chalie.mcp_server.app import ChalieServer, Gateway

    server = ChalieServer(Gateway(False, None), name="chalie")
    kinds = [type(m).__name__ for m in server.middleware]
    assert "OpenTelemetryMiddleware" not in kinds
    assert kinds  # the SDK's other built-ins (request state) stay


def test_stored_events_read_after_subscribing_go_before_the_live_ones() -> None:
    from chalie.mcp_server.talk import _Follow
    from chalie.wire.events import ErrorEvent, TurnFinished, TurnStarted

    async def scenario() -> list[int]:
        follow = _Follow(asyncio.get_running_loop(), "m1")
        base = {"conversation_id": "c1", "ts": 0.0}
        started = TurnStarted(**base, seq=1, turn_id="t1", client_msg_id="m1", text="hi")
        error = ErrorEvent(**base, seq=2, turn_id="t1", code="model-error", message="boom")
        ended = TurnFinished(**base, seq=3, turn_id="t1", reason="model-error", text="")
        follow.push(ended)  # live: the turn ended while this call subscribed
        follow.backfill([started, error, ended])  # stored before the subscription
        await asyncio.sleep(0)
        out = []
        while not follow.queue.empty():
            out.append(follow.queue.get_nowait().seq)  # type: ignore[attr-defined]
        return out

    assert asyncio.run(scenario()) == [1, 2, 3, 3]  # in order; accept() drops the repeat


def _id(r: Any, name: str) -> str:
    """The stable id of the token ``name`` (limits and sessions are keyed by it)."""
    return str(next(t.id for t in r.tokens.list() if t.name == name))


def test_the_bearer_scheme_is_case_insensitive_at_the_gate_as_on_the_websocket() -> None:
    with running() as r:
        secret = r.tokens.create("casual")
        for scheme in ("bearer", "BEARER", "bEaReR"):
            resp = raw_post(r, initialize_body(), authorization=f"{scheme} {secret}")
            assert resp.status_code == 200, scheme
        assert raw_post(r, initialize_body(), authorization=f"Basic {secret}").status_code == 401


def test_a_body_nested_100000_deep_is_a_json_malformed_answer_and_the_server_goes_on() -> None:
    with running() as r:
        auth = f"Bearer {r.tokens.create('deep')}"
        for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 20_000 + b"1" + b"}" * 20_000):
            resp = raw_post(r, content=deep, authorization=auth)
            assert resp.status_code == 400
            assert resp.headers["content-type"] == "application/json"
            assert resp.json()["error"]["data"]["code"] == "malformed-frame"
            assert "Traceback" not in resp.text
        # Brackets inside a string are no nesting.
        fine = initialize_body()
        fine["params"]["clientInfo"]["name"] = "[" * 500
        assert raw_post(r, fine, authorization=auth).status_code == 200


def test_one_token_cannot_take_every_session_nor_reach_another_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with running(max_sessions=100, max_sessions_per_token=2) as r:
        greedy, other = r.tokens.create("greedy"), r.tokens.create("other")
        opened = [
            raw_post(r, initialize_body(), authorization=f"Bearer {greedy}") for _ in range(3)
        ]
        assert [o.status_code for o in opened] == [200, 200, 429]
        assert opened[2].json()["error"]["data"]["code"] == "rate-limited"
        # Issue 30: the warning names the token by its id, as the log writes it (not masked).
        from chalie.process.logs import JsonFormatter

        (warned,) = [x for x in caplog.records if "session quota" in x.getMessage()]
        (greedy_info,) = [t for t in r.tokens.list() if t.name == "greedy"]
        assert f'"principal":"{greedy_info.id}"' in JsonFormatter().format(warned)
        theirs = raw_post(r, initialize_body(), authorization=f"Bearer {other}")
        assert theirs.status_code == 200
        # A session id the gate never saw created is nobody's: 404, never re-bound.
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        made_up = raw_post(
            r,
            listing,
            authorization=f"Bearer {other}",
            mcp_session_id="0" * 32,
            mcp_protocol_version="2025-11-25",
        )
        assert made_up.status_code == 404
        # Ending one of its sessions gives the token room again.
        with httpx2.Client(timeout=10) as http:
            ended = http.delete(
                r.url,
                headers={
                    "authorization": f"Bearer {greedy}",
                    "mcp-session-id": opened[0].headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-11-25",
                },
            )
        assert ended.status_code in (200, 204)
        again = raw_post(r, initialize_body(), authorization=f"Bearer {greedy}")
        assert again.status_code == 200
