"""The three wire formats: OpenAI chat completions, Ollama ``/api/chat``, Anthropic Messages.

Each format is pure translation: the request body from a
:class:`~chalie.providers.types.ModelRequest`, a whole response back to a
:class:`~chalie.providers.types.ModelResponse`, and an :class:`Assembler`
that turns streamed chunks into text deltas and finally the same response
(tool calls assembled incrementally). No I/O here: :mod:`chalie.providers.client`
does the HTTP.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import msgspec

from chalie.process.config import ProviderKind
from chalie.providers.types import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ProviderError,
    StopReason,
    ToolCallPart,
    Usage,
)

_encoder: Final = msgspec.json.Encoder()

ANTHROPIC_VERSION: Final = "2023-06-01"
StreamFraming = Literal["sse", "ndjson"]


def bad_response(what: str) -> ProviderError:
    return ProviderError("model-bad-response", f"the model server sent {what}", retryable=False)


def background_note(message: ChatMessage) -> str:
    return f"[background result of {message.tool} call {message.call_id}]\n{message.text}"


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str]:
    """Tool-call arguments as a dict, or (None, raw text) when they are not a JSON object."""
    if isinstance(raw, dict):
        return raw, ""
    if raw is None or raw == "":
        return {}, ""
    text = raw if isinstance(raw, str) else json.dumps(raw)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # a model's text nested past the parser's depth
        return None, text[:2000]
    return (value, "") if isinstance(value, dict) else (None, text[:2000])


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(call_id: str, name: str, raw: Any) -> ToolCallPart:
    """One tool call, its arguments parsed (kept as text when they are not an object)."""
    args, text = parse_arguments(raw)
    return ToolCallPart(id=call_id or new_call_id(), name=name, arguments=args, raw=text)


def _usage(counts: Any, input_key: str, output_key: str) -> Usage:
    """Token counts from a server's usage object, by its own two key names."""
    return Usage(
        input_tokens=int(counts.get(input_key) or 0),
        output_tokens=int(counts.get(output_key) or 0),
    )


class Assembler(Protocol):
    def feed(self, chunk: dict[str, Any], event: str = "") -> list[str]:
        """Take one decoded chunk; return the text deltas it carried."""

    def finish(self) -> ModelResponse: ...

    @property
    def complete(self) -> bool:
        """Whether the stream's own end marker arrived."""


class Wire(Protocol):
    kind: ProviderKind
    framing: StreamFraming

    def path(self) -> str: ...

    def headers(self, api_key: str | None) -> dict[str, str]: ...

    def body(self, request: ModelRequest, model: str, *, stream: bool) -> dict[str, Any]: ...

    def constrain(
        self, body: dict[str, Any], schema: dict[str, Any], temperature: float | None
    ) -> None:
        """Hold the output to ``schema`` (chalie.providers.steps; openai and ollama only),
        sampled at ``temperature`` (None: the server's own)."""

    def parse(self, data: Any) -> ModelResponse: ...

    def assembler(self) -> Assembler: ...


# -- OpenAI chat completions ----------------------------------------------------------


def _openai_tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema", {"type": "object"}),
            },
        }
        for t in request.tools
    ]


def _json_text(value: Any) -> str:
    """``value`` as JSON text (msgspec: several times faster than json.dumps)."""
    return _encoder.encode(value).decode()


def _openai_messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": request.system}]
    for m in request.messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.text})
        elif m.role == "background":
            out.append({"role": "user", "content": background_note(m)})
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": m.text})
        else:
            msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": c.raw if c.arguments is None else _json_text(c.arguments),
                        },
                    }
                    for c in m.tool_calls
                ]
            out.append(msg)
    return out


def _stop(reason: Any, has_calls: bool) -> StopReason:
    if has_calls:
        return "tool_calls"
    if reason in ("length", "max_tokens"):
        return "length"
    return "final"


def _response(
    text: str, calls: tuple[ToolCallPart, ...], usage: Usage, reason: Any
) -> ModelResponse:
    """The whole answer: its text, its calls, its usage, and why it stopped."""
    return ModelResponse(text=text, tool_calls=calls, usage=usage, stop=_stop(reason, bool(calls)))


def bearer(api_key: str | None) -> dict[str, str]:
    """The OpenAI-style credentials header (OpenAI and Ollama servers); none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class OpenAIWire:
    kind: ProviderKind = "openai"
    framing: StreamFraming = "sse"

    def path(self) -> str:
        return "/chat/completions"

    headers = staticmethod(bearer)

    def body(self, request: ModelRequest, model: str, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": _openai_messages(request),
            "max_tokens": request.max_tokens,
            "stream": stream,
        }
        if request.tools:
            body["tools"] = _openai_tools(request)
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def constrain(
        self, body: dict[str, Any], schema: dict[str, Any], temperature: float | None
    ) -> None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "step", "schema": schema},
        }
        if temperature is not None:
            body["temperature"] = temperature

    def parse(self, data: Any) -> ModelResponse:
        try:
            choice = data["choices"][0]
            message = choice["message"]
            calls = tuple(
                _call(
                    raw.get("id") or "", raw["function"]["name"], raw["function"].get("arguments")
                )
                for raw in message.get("tool_calls") or []
            )
            return _response(
                message.get("content") or "",
                calls,
                _usage(data.get("usage") or {}, "prompt_tokens", "completion_tokens"),
                choice.get("finish_reason"),
            )
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            raise bad_response("a chat completion without the expected fields") from None

    def assembler(self) -> Assembler:
        return _OpenAIAssembler()


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    whole: Any = None  # Ollama sends whole argument objects

    def part(self) -> ToolCallPart:
        raw: Any = self.whole if self.whole is not None else "".join(self.arguments)
        return _call(self.id, self.name, raw)


class _OpenAIAssembler:
    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._usage = Usage()
        self._reason: Any = None
        self.complete = False

    def feed(self, chunk: dict[str, Any], event: str = "") -> list[str]:
        if chunk.get("__done__"):
            self.complete = True
            return []
        try:
            usage = chunk.get("usage")
            if usage:
                self._usage = _usage(usage, "prompt_tokens", "completion_tokens")
            deltas: list[str] = []
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    self._text.append(text)
                    deltas.append(text)
                for tc in delta.get("tool_calls") or []:
                    slot = self._calls.setdefault(int(tc.get("index", 0)), _PartialCall())
                    if tc.get("id"):
                        slot.id = tc["id"]
                    fn = tc.get("function") or {}
                    if fn.get("name"):
                        slot.name = fn["name"]
                    if fn.get("arguments"):
                        slot.arguments.append(fn["arguments"])
                if choice.get("finish_reason"):
                    self._reason = choice["finish_reason"]
            return deltas
        except (TypeError, ValueError, AttributeError):
            raise bad_response("a stream chunk without the expected fields") from None

    def finish(self) -> ModelResponse:
        calls = tuple(self._calls[i].part() for i in sorted(self._calls))
        return _response("".join(self._text), calls, self._usage, self._reason)


# -- Ollama /api/chat --------------------------------------------------------------------


def _ollama_messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": request.system}]
    for m in request.messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.text})
        elif m.role == "background":
            out.append({"role": "user", "content": background_note(m)})
        elif m.role == "tool":
            out.append({"role": "tool", "content": m.text, "tool_name": m.tool})
        else:
            msg: dict[str, Any] = {"role": "assistant", "content": m.text}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "function": {
                            "name": c.name,
                            "arguments": c.arguments if c.arguments is not None else {},
                        }
                    }
                    for c in m.tool_calls
                ]
            out.append(msg)
    return out


class OllamaWire:
    kind: ProviderKind = "ollama"
    framing: StreamFraming = "ndjson"

    def path(self) -> str:
        return "/api/chat"

    headers = staticmethod(bearer)

    def body(self, request: ModelRequest, model: str, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": _ollama_messages(request),
            "stream": stream,
            "options": {"num_predict": request.max_tokens},
        }
        if request.tools:
            body["tools"] = _openai_tools(request)
        return body

    def constrain(
        self, body: dict[str, Any], schema: dict[str, Any], temperature: float | None
    ) -> None:
        body["format"] = schema
        if temperature is not None:
            body.setdefault("options", {})["temperature"] = temperature

    def parse(self, data: Any) -> ModelResponse:
        assembler = _OllamaAssembler()
        assembler.feed(data)
        if not assembler.complete:
            raise bad_response("a chat response that is not done")
        return assembler.finish()

    def assembler(self) -> Assembler:
        return _OllamaAssembler()


class _OllamaAssembler:
    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: list[_PartialCall] = []
        self._usage = Usage()
        self._reason: Any = None
        self.complete = False

    def feed(self, chunk: dict[str, Any], event: str = "") -> list[str]:
        try:
            if chunk.get("error"):
                raise ProviderError(
                    "model-rejected",
                    f"the model server said: {str(chunk['error'])[:300]}",
                    retryable=False,
                )
            message = chunk.get("message") or {}
            deltas: list[str] = []
            text = message.get("content")
            if text:
                self._text.append(text)
                deltas.append(text)
            for tc in message.get("tool_calls") or []:
                fn = tc["function"]
                self._calls.append(
                    _PartialCall(id=tc.get("id") or "", name=fn["name"], whole=fn.get("arguments"))
                )
            if chunk.get("done"):
                self.complete = True
                self._reason = chunk.get("done_reason")
                self._usage = _usage(chunk, "prompt_eval_count", "eval_count")
            return deltas
        except (KeyError, TypeError, ValueError, AttributeError):
            raise bad_response("a chat chunk without the expected fields") from None

    def finish(self) -> ModelResponse:
        calls = tuple(c.part() for c in self._calls)
        return _response("".join(self._text), calls, self._usage, self._reason)


# -- Anthropic Messages ------------------------------------------------------------------


def _anthropic_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """Blocks in alternating turns: consecutive same-role entries merge into one message."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in request.messages:
        if m.role == "user":
            add("user", [{"type": "text", "text": m.text or " "}])
        elif m.role == "background":
            add("user", [{"type": "text", "text": background_note(m)}])
        elif m.role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.call_id, "content": m.text}])
        else:
            blocks: list[dict[str, Any]] = []
            if m.text:
                blocks.append({"type": "text", "text": m.text})
            for c in m.tool_calls:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": c.id,
                        "name": c.name,
                        "input": c.arguments if c.arguments is not None else {},
                    }
                )
            add("assistant", blocks or [{"type": "text", "text": " "}])
    return out


class AnthropicWire:
    kind: ProviderKind = "anthropic"
    framing: StreamFraming = "sse"

    def path(self) -> str:
        return "/v1/messages"

    def headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def body(self, request: ModelRequest, model: str, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "system": request.system,
            "messages": _anthropic_messages(request),
            "max_tokens": request.max_tokens,
            "stream": stream,
        }
        if request.tools:
            body["tools"] = [
                {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "input_schema": t.get("input_schema", {"type": "object"}),
                }
                for t in request.tools
            ]
        return body

    def constrain(
        self, body: dict[str, Any], schema: dict[str, Any], temperature: float | None
    ) -> None:
        raise ValueError("the anthropic wire has no JSON-schema output (structured steps)")

    def parse(self, data: Any) -> ModelResponse:
        try:
            texts: list[str] = []
            calls: list[ToolCallPart] = []
            for block in data["content"]:
                if block.get("type") == "text":
                    texts.append(block.get("text", ""))
                elif block.get("type") == "tool_use":
                    calls.append(_call(block.get("id") or "", block["name"], block.get("input")))
            return _response(
                "".join(texts),
                tuple(calls),
                _usage(data.get("usage") or {}, "input_tokens", "output_tokens"),
                data.get("stop_reason"),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise bad_response("a message without the expected fields") from None

    def assembler(self) -> Assembler:
        return _AnthropicAssembler()


class _AnthropicAssembler:
    def __init__(self) -> None:
        self._text: list[str] = []
        self._blocks: dict[int, _PartialCall] = {}
        self._input = 0
        self._output = 0
        self._reason: Any = None
        self.complete = False

    def feed(self, chunk: dict[str, Any], event: str = "") -> list[str]:
        kind = chunk.get("type") or event
        try:
            if kind == "error":
                err = chunk.get("error") or {}
                overloaded = err.get("type") in ("overloaded_error", "rate_limit_error")
                raise ProviderError(
                    "model-unreachable" if overloaded else "model-rejected",
                    f"the model server said: {str(err.get('message', ''))[:300]}",
                    retryable=overloaded,
                )
            if kind == "message_start":
                usage = (chunk.get("message") or {}).get("usage") or {}
                self._input = int(usage.get("input_tokens") or 0)
                self._output = int(usage.get("output_tokens") or 0)
            elif kind == "content_block_start":
                block = chunk["content_block"]
                if block.get("type") == "tool_use":
                    self._blocks[int(chunk["index"])] = _PartialCall(
                        id=block.get("id", ""), name=block["name"]
                    )
                elif block.get("type") == "text" and block.get("text"):
                    self._text.append(block["text"])
                    return [block["text"]]
            elif kind == "content_block_delta":
                delta = chunk["delta"]
                if delta.get("type") == "text_delta":
                    self._text.append(delta["text"])
                    return [delta["text"]]
                if delta.get("type") == "input_json_delta":
                    self._blocks[int(chunk["index"])].arguments.append(delta["partial_json"])
            elif kind == "message_delta":
                self._reason = (chunk.get("delta") or {}).get("stop_reason")
                usage = chunk.get("usage") or {}
                if usage.get("output_tokens") is not None:
                    self._output = int(usage["output_tokens"])
            elif kind == "message_stop":
                self.complete = True
            return []
        except (KeyError, TypeError, ValueError, AttributeError):
            raise bad_response("a stream event without the expected fields") from None

    def finish(self) -> ModelResponse:
        calls = tuple(self._blocks[i].part() for i in sorted(self._blocks))
        usage = Usage(input_tokens=self._input, output_tokens=self._output)
        return _response("".join(self._text), calls, usage, self._reason)


WIRES: Final[dict[str, Wire]] = {
    "openai": OpenAIWire(),
    "ollama": OllamaWire(),
    "anthropic": AnthropicWire(),
}
