"""The scripted model server: a raw ASGI app on uvicorn speaking the three wire formats.

Routes: ``POST /v1/chat/completions`` and ``/chat/completions`` (OpenAI),
``POST /api/chat`` (Ollama), ``POST /v1/messages`` (Anthropic), each
streaming or not as the request's ``stream`` says; ``GET /_requests`` lists
the request bodies received (tests read what the model saw), ``GET /_timings``
when each request arrived and each answer was sent (monotonic). Bound to
127.0.0.1 on an ephemeral port unless told otherwise.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

from chalie.net.asgi_server import Server
from chalie.net.listener import tcp_listener
from tools.fake_llm.script import (
    Player,
    Script,
    Step,
    as_step_object,
    call_id,
    last_is_tool,
    last_user_text,
    output_schema,
    resolve,
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# The name the server lists for itself (it answers any model name a request gives).
MODEL_NAME = "scripted"
# GET: the model lists a client reads to see what a server offers (chalie's start-up probe).
LISTS = {
    "/v1/models": {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]},
    "/models": {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]},
    "/api/tags": {"models": [{"name": MODEL_NAME, "model": MODEL_NAME}]},
}
ROUTES = {
    "/v1/chat/completions": "openai",
    "/chat/completions": "openai",
    "/api/chat": "ollama",
    "/v1/messages": "anthropic",
}


class _Drop(Exception):
    """Close the connection mid-stream."""


def _pieces(text: str, size: int) -> list[str]:
    if not text:
        return []
    if size <= 0:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


def _openai_chunks(step: Step, text: str, model: str) -> list[bytes]:
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
    out: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    ]
    for piece in _pieces(text, step.chunk):
        out.append({**base, "choices": [{"index": 0, "delta": {"content": piece}}]})
    for i, tc in enumerate(step.tool_calls):
        args = tc.arguments_text()
        half = len(args) // 2
        out.append(
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": i,
                                    "id": tc.id or call_id(),
                                    "type": "function",
                                    "function": {"name": tc.name, "arguments": ""},
                                }
                            ]
                        },
                    }
                ],
            }
        )
        for part in (args[:half], args[half:]):
            if part:
                out.append(
                    {
                        **base,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {
                                    "tool_calls": [{"index": i, "function": {"arguments": part}}]
                                },
                            }
                        ],
                    }
                )
    reason = "tool_calls" if step.tool_calls else "stop"
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    out.append(
        {
            **base,
            "choices": [],
            "usage": {
                "prompt_tokens": step.input_tokens,
                "completion_tokens": step.output_tokens,
                "total_tokens": step.input_tokens + step.output_tokens,
            },
        }
    )
    frames = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in out]
    frames.append(b"data: [DONE]\n\n")
    return frames


def _openai_whole(step: Step, text: str, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if step.tool_calls:
        message["tool_calls"] = [
            {
                "id": tc.id or call_id(),
                "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments_text()},
            }
            for tc in step.tool_calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if step.tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": step.input_tokens,
            "completion_tokens": step.output_tokens,
            "total_tokens": step.input_tokens + step.output_tokens,
        },
    }


def _ollama_args(tc: Any) -> Any:
    # Ollama sends an object; a "raw" step sends the text as a string (malformed).
    return tc.raw if tc.raw is not None else (tc.arguments or {})


def _ollama_chunks(step: Step, text: str, model: str) -> list[bytes]:
    out: list[dict[str, Any]] = []
    for piece in _pieces(text, step.chunk):
        out.append(
            {"model": model, "message": {"role": "assistant", "content": piece}, "done": False}
        )
    if step.tool_calls:
        out.append(
            {
                "model": model,
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": tc.name, "arguments": _ollama_args(tc)}}
                        for tc in step.tool_calls
                    ],
                },
                "done": False,
            }
        )
    out.append(
        {
            "model": model,
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": step.input_tokens,
            "eval_count": step.output_tokens,
        }
    )
    return [json.dumps(c).encode() + b"\n" for c in out]


def _ollama_whole(step: Step, text: str, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if step.tool_calls:
        message["tool_calls"] = [
            {"function": {"name": tc.name, "arguments": _ollama_args(tc)}} for tc in step.tool_calls
        ]
    return {
        "model": model,
        "message": message,
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": step.input_tokens,
        "eval_count": step.output_tokens,
    }


def _anthropic_chunks(step: Step, text: str, model: str) -> list[bytes]:
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": step.input_tokens, "output_tokens": 0},
                },
            },
        )
    ]
    index = 0
    if text:
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
        )
        for piece in _pieces(text, step.chunk):
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": piece},
                    },
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for tc in step.tool_calls:
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {
                        "type": "tool_use",
                        "id": tc.id or call_id(),
                        "name": tc.name,
                        "input": {},
                    },
                },
            )
        )
        args = tc.arguments_text()
        half = len(args) // 2
        for part in (args[:half], args[half:]):
            if part:
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": part},
                        },
                    )
                )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if step.tool_calls else "end_turn"},
                "usage": {"output_tokens": step.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return [f"event: {name}\ndata: {json.dumps(body)}\n\n".encode() for name, body in events]


def _anthropic_whole(step: Step, text: str, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
    for tc in step.tool_calls:
        try:
            value: Any = json.loads(tc.arguments_text())
        except ValueError:
            value = tc.arguments_text()  # malformed: the fake sends what it was told
        content.append(
            {"type": "tool_use", "id": tc.id or call_id(), "name": tc.name, "input": value}
        )
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if step.tool_calls else "end_turn",
        "usage": {"input_tokens": step.input_tokens, "output_tokens": step.output_tokens},
    }


STREAMS = {"openai": _openai_chunks, "ollama": _ollama_chunks, "anthropic": _anthropic_chunks}
WHOLES = {"openai": _openai_whole, "ollama": _ollama_whole, "anthropic": _anthropic_whole}
CONTENT_TYPES = {
    "openai": b"text/event-stream",
    "ollama": b"application/x-ndjson",
    "anthropic": b"text/event-stream",
}


class FakeModelApp:
    """The ASGI app: replays ``script``; records each request (path, headers, body)."""

    def __init__(self, script: Script, *, keep: int = 1000) -> None:
        self.player = Player(script)
        self.requests: list[dict[str, Any]] = []
        self.answered: list[float] = []  # monotonic time each response was fully sent
        self.received: list[float] = []  # monotonic time each request arrived
        self._keep = keep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        arrived = time.monotonic()
        path = scope["path"]
        if scope["method"] == "GET" and path == "/_requests":
            await self._json(send, 200, self.requests)
            return
        if scope["method"] == "GET" and path == "/_timings":
            await self._json(send, 200, {"received": self.received, "answered": self.answered})
            return
        if scope["method"] == "GET" and path in LISTS:
            await self._json(send, 200, LISTS[path])
            return
        fmt = ROUTES.get(path)
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        if fmt is None or scope["method"] != "POST":
            await self._json(send, 404, {"error": {"message": f"no route {path}"}})
            return
        try:
            body = json.loads(b"".join(chunks))
        except ValueError:
            await self._json(send, 400, {"error": {"message": "body is not JSON"}})
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.received.append(arrived)
        self.requests.append({"path": path, "format": fmt, "headers": headers, "body": body})
        del self.requests[: -self._keep]
        del self.received[: -self._keep]
        step = self.player.next_step(last_is_tool(fmt, body))
        if step is None:
            await self._json(send, 500, {"error": {"message": "script exhausted"}})
            return
        step = resolve(step, fmt, body)
        schema = output_schema(fmt, body)
        if schema is not None and self.player.script.schema == "honour":
            step = as_step_object(step, schema)
        await self._answer(send, fmt, body, step)
        self.answered.append(time.monotonic())
        del self.answered[: -self._keep]

    async def _answer(self, send: Send, fmt: str, body: dict[str, Any], step: Step) -> None:
        if step.delay:
            await asyncio.sleep(step.delay)
        if step.hang:
            await asyncio.sleep(3600)
            return
        if step.status is not None:
            extra = [(b"retry-after", step.retry_after.encode())] if step.retry_after else []
            payload = (
                step.body
                or json.dumps(
                    {"error": {"type": "error", "message": f"scripted status {step.status}"}}
                )
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": step.status,
                    "headers": [(b"content-type", b"application/json"), *extra],
                }
            )
            await send({"type": "http.response.body", "body": payload})
            return
        text = step.text.replace("{last_user}", last_user_text(fmt, body))
        model = str(body.get("model", "fake"))
        if not body.get("stream", fmt == "ollama"):
            await self._json(send, 200, WHOLES[fmt](step, text, model))
            return
        frames = STREAMS[fmt](step, text, model)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", CONTENT_TYPES[fmt]), (b"cache-control", b"no-cache")],
            }
        )
        for i, frame in enumerate(frames):
            if step.drop_after is not None and i >= step.drop_after:
                raise _Drop("scripted drop")
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            if step.chunk_delay and i + 1 < len(frames):
                await asyncio.sleep(step.chunk_delay)  # a model that writes at its own pace
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _json(send: Send, status: int, value: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(value).encode()})


class FakeModelServer:
    """Runs the app on uvicorn in a thread; ``url`` is its base (``http://127.0.0.1:PORT``)."""

    def __init__(self, script: Script, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = FakeModelApp(script)
        # TCP_NODELAY on every connection (see chalie.net.listener): no 40 ms delayed-ACK stalls.
        self._sock = tcp_listener(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self._server = Server(
            uvicorn.Config(
                self.app,
                log_level="critical",
                lifespan="off",
                access_log=False,
                ws="none",
                http="h11",
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.app.requests

    def serve_forever(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self) -> FakeModelServer:
        self._thread = threading.Thread(target=self.serve_forever, name="fake-llm", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self._server.force_exit = True
        self._server.exit()
        if self._thread is not None:
            self._thread.join(10)
        self._sock.close()

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
