"""The provider client against the scripted server and against hostile servers, for each format."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from chalie.process.config import ModelConfig
from chalie.providers.client import ModelClient
from chalie.providers.formats import WIRES
from chalie.providers.types import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ProviderError,
    ToolCallPart,
    parse_retry_after,
)
from tests.core.conversation.harness import FORMATS, base_url
from tools.fake_llm import FakeModelServer, load_script
from tools.fake_llm.script import Player

REQUEST = ModelRequest(
    system="be brief",
    messages=(
        ChatMessage(role="user", text="hi"),
        ChatMessage(
            role="assistant",
            tool_calls=(ToolCallPart(id="t1", name="clock", arguments={"zone": "UTC"}),),
        ),
        ChatMessage(role="tool", call_id="t1", tool="clock", text="[clock(status=success)]\nx"),
        ChatMessage(role="background", call_id="b1", tool="clock", text="late"),
        ChatMessage(role="user", text="and now?"),
    ),
    tools=({"name": "clock", "description": "tells time", "input_schema": {"type": "object"}},),
)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer(load_script("{}")) as srv:
        yield srv


def complete(
    server: FakeModelServer, fmt: str, script: dict[str, Any], **cfg: Any
) -> tuple[ModelResponse, list[str]]:
    server.app.player = Player(load_script(json.dumps(script)))
    server.app.requests.clear()
    cfg.setdefault("backoff", 0.01)
    client = ModelClient(
        "t", ModelConfig(provider=fmt, base_url=base_url(server, fmt), model="m", **cfg)
    )
    deltas: list[str] = []

    async def go() -> ModelResponse:
        try:
            return await client.complete(REQUEST, deltas.append)
        finally:
            await client.aclose()

    return asyncio.run(go()), deltas


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("fmt", FORMATS)
def test_text_tool_calls_and_usage_come_back_in_every_format(
    server: FakeModelServer, fmt: str, stream: bool
) -> None:
    response, deltas = complete(
        server,
        fmt,
        {
            "on_user": {
                "text": "hello there",
                "chunk": 3,
                "input_tokens": 7,
                "output_tokens": 3,
                "tool_calls": [
                    {"id": "x1", "name": "clock", "arguments": {"zone": "Europe/Malta"}},
                    {"id": "x2", "name": "calculator", "raw": "{oops"},
                ],
            }
        },
        stream=stream,
    )
    assert response.text == "hello there" and "".join(deltas) == "hello there"
    if stream:
        assert len(deltas) == 4
    assert [c.name for c in response.tool_calls] == ["clock", "calculator"]
    assert response.tool_calls[0].arguments == {"zone": "Europe/Malta"}
    assert response.tool_calls[1].arguments is None and response.tool_calls[1].raw == "{oops"
    assert response.usage.input_tokens == 7 and response.usage.output_tokens == 3
    assert response.stop == "tool_calls"


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_request_carries_native_tool_results_and_the_key_header(
    server: FakeModelServer, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODEL_KEY", "sk-test-123")
    complete(
        server,
        fmt,
        {"on_tool": {"text": "ok"}, "on_user": {"text": "ok"}},
        api_key_env="FAKE_MODEL_KEY",
    )
    request = server.requests[0]
    body, headers = request["body"], request["headers"]
    if fmt == "anthropic":
        assert headers["x-api-key"] == "sk-test-123"
        assert body["system"] == "be brief"
        blocks = [b for m in body["messages"] for b in m["content"]]
        assert {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": "[clock(status=success)]\nx",
        } in blocks
        roles = [m["role"] for m in body["messages"]]
        assert all(a != b for a, b in itertools.pairwise(roles))  # alternating
    else:
        assert headers["authorization"] == "Bearer sk-test-123"
        tool = next(m for m in body["messages"] if m["role"] == "tool")
        if fmt == "openai":
            assert tool == {
                "role": "tool",
                "tool_call_id": "t1",
                "content": "[clock(status=success)]\nx",
            }
        else:
            assert tool["tool_name"] == "clock"


def test_the_key_is_never_in_an_error_message(
    server: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODEL_KEY", "sk-secret-999")
    with pytest.raises(ProviderError) as err:
        complete(
            server,
            "openai",
            {"on_user": {"status": 401, "body": "bad key"}},
            api_key_env="FAKE_MODEL_KEY",
        )
    assert err.value.code == "model-rejected" and not err.value.retryable
    assert "sk-secret" not in str(err.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_stream_that_stops_early_is_retried_then_reported(
    server: FakeModelServer, fmt: str
) -> None:
    with pytest.raises(ProviderError) as err:
        complete(
            server, fmt, {"on_user": {"text": "abcdef", "chunk": 1, "drop_after": 2}}, retries=1
        )
    assert err.value.code == "model-unreachable" and err.value.retryable
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("-1", None),
        ("nan", None),
        ("Wed, 21 Oct 2015", None),
        ("1e9", 60.0),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_is_read_as_bounded_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "data", [{}, {"choices": []}, {"content": "nope"}, {"message": 5}, [], "text", None]
)
def test_a_whole_response_without_the_expected_fields_is_a_clean_error(fmt: str, data: Any) -> None:
    with pytest.raises(ProviderError) as err:
        WIRES[fmt].parse(data)
    assert err.value.code == "model-bad-response"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": [{"delta": {"tool_calls": [{"index": "x"}]}}]},
        {"message": {"tool_calls": [{"function": {}}]}},
        {"type": "content_block_delta", "index": 9, "delta": {"type": "input_json_delta"}},
        {"choices": "junk", "message": [], "type": 7},
    ],
)
def test_a_hostile_stream_chunk_is_a_clean_error_or_ignored(
    fmt: str, chunk: dict[str, Any]
) -> None:
    assembler = WIRES[fmt].assembler()
    try:
        assembler.feed(chunk)
    except ProviderError as exc:
        assert exc.code == "model-bad-response"


@pytest.mark.slow
def test_the_scripted_server_runs_from_the_command_line(tmp_path: Any) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"on_user": {"text": "from the CLI"}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.fake_llm", str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().rsplit(" ", 1)[-1].strip()
        client = ModelClient("t", ModelConfig(provider="ollama", base_url=url, model="m"))

        async def go() -> ModelResponse:
            try:
                return await client.complete(REQUEST, lambda _: None)
            finally:
                await client.aclose()

        assert asyncio.run(go()).text == "from the CLI"
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    bad = tmp_path / "bad.json"
    bad.write_text('{"steps": [{"bogus": 1}]}')
    failed = subprocess.run(
        [sys.executable, "-m", "tools.fake_llm", str(bad)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert failed.returncode == 1 and "cannot use" in failed.stderr
