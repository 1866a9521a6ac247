"""One language model over HTTP: a request, streamed or whole, retried where retrying helps.

Runs on the daemon's event loop (``async``). Written on our own small HTTP/1.1
client (:mod:`chalie.providers.http`): the three formats are a few lines of
framing each; an SDK would add an import of about a second, its own retries
(one 429 becoming three requests) and about 0.5 ms a call, and httpx2 itself
cost about 1 ms of the loop's CPU a request.

Lifecycle of :meth:`ModelClient.complete`:

1. Build the body for the configured wire format; read the key from the
   environment variable the configuration names (never logged, never in an
   error message).
2. POST; a non-2xx status becomes a :class:`ProviderError` (429, 5xx:
   retryable, with ``Retry-After`` read; other 4xx: not).
3. Stream: each line (SSE ``data:`` or NDJSON) goes to the format's
   assembler; text deltas go to ``on_delta`` as they arrive. A stream that
   ends without its end marker counts as dropped (retryable).
4. Retry a retryable failure up to ``retries`` times, waiting
   ``max(Retry-After, backoff * 2**attempt)``; ``on_retry`` is told first,
   so the user sees it. The error finally raised names the model, its URL
   and what to do next (:func:`named`).
5. Cancelling the task closes the HTTP stream (a response not read to its
   end closes its connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import msgspec

from chalie.process.config import ModelConfig
from chalie.providers import signatures, steps
from chalie.providers.formats import WIRES, Wire, new_call_id
from chalie.providers.http import HttpClient, HttpError, Response, proxy_from_environment
from chalie.providers.types import ModelRequest, ModelResponse, ProviderError, parse_retry_after

log = logging.getLogger("chalie.providers")

MAX_ERROR_BODY: Final = 300
MAX_BODY: Final = 16 * 1024 * 1024  # a whole (not streamed) answer
MAX_LINE: Final = 4 * 1024 * 1024
# Connections open to one model server at most; more turns than this wait for one.
MAX_CONNECTIONS: Final = 256
DRAIN_MAX: Final = 64 * 1024
DRAIN_SECONDS: Final = 1.0
JSON_HEADERS: Final = {"Content-Type": "application/json"}
_encoder = msgspec.json.Encoder()
# msgspec's decoder: a streamed answer is a JSON line per token, several times cheaper than json.
_decoder = msgspec.json.Decoder()

OnDelta = Callable[[str], None]
OnRetry = Callable[[int, ProviderError, float], None]


def _status_error(status: int, body: bytes, retry_after: str | None) -> ProviderError:
    text = body[:MAX_ERROR_BODY].decode("utf-8", "replace").replace("\n", " ")
    if status == 429 or status >= 500:
        return ProviderError(
            "model-unreachable",
            f"the model server answered HTTP {status}: {text}",
            retryable=True,
            status=status,
            retry_after=parse_retry_after(retry_after),
        )
    return ProviderError(
        "model-rejected",
        f"the model server refused the request with HTTP {status}: {text}",
        retryable=False,
        status=status,
    )


def next_step(name: str, config: ModelConfig, err: ProviderError) -> str:
    """What the person can do about ``err`` from the model ``[models.NAME]``, in one sentence."""
    section = f"[models.{name}]"
    if err.code == "model-bad-response":
        return (
            f"check that {section} provider = {config.provider!r} is the wire format "
            "this server speaks (openai, ollama or anthropic)"
        )
    if err.status in (401, 403):
        if config.api_key_env:
            return f"check the key in ${config.api_key_env} ({section} api_key_env)"
        return f"the server wants a key: set {section} api_key_env to the variable holding it"
    if err.status == 404:
        pull = f" (Ollama: ollama pull {config.model})" if config.provider == "ollama" else ""
        return f"check {section} model = {config.model!r} and base_url{pull}"
    if err.status is not None and (err.status == 429 or err.status >= 500):
        return "the server is overloaded or failing; try again in a moment"
    if err.status is not None:
        return "the server's answer above says what it refused"
    return (
        f"start a model server at {config.base_url}, or set {section} base_url "
        "and model in config.toml to one that runs (docs/configuration.rst), then restart chalie"
    )


def named(name: str, config: ModelConfig, err: ProviderError) -> ProviderError:
    """``err`` saying which model failed, at which URL, and what to do next."""
    message = (
        f"model {name} ({config.model} at {config.base_url}): {err.message}; "
        f"next: {next_step(name, config, err)}"
    )
    return ProviderError(
        err.code,
        message,
        retryable=err.retryable,
        status=err.status,
        retry_after=err.retry_after,
    )


class ModelClient:
    """A configured model (one ``[models.NAME]``) and its connections, used on one loop."""

    def __init__(self, name: str, config: ModelConfig) -> None:
        self.name = name
        self.config = config
        self.wire: Wire = WIRES[config.provider]
        self._http: HttpClient | None = None

    def http(self) -> HttpClient:
        if self._http is None:
            cfg = self.config
            try:
                # A cloud model behind a proxy: the standard variables (loopback never).
                proxy = proxy_from_environment(cfg.base_url)
            except ValueError as exc:
                raise ProviderError(
                    "model-unreachable",
                    f"the proxy variable cannot be used: {exc}",
                    retryable=False,
                ) from None
            self._http = HttpClient(
                cfg.base_url,
                connect_timeout=cfg.connect_timeout,
                read_timeout=cfg.read_timeout,
                max_connections=MAX_CONNECTIONS,
                proxy=proxy,
            )
        return self._http

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    def api_key(self) -> str | None:
        env = self.config.api_key_env
        return os.environ.get(env) if env else None

    async def complete(
        self,
        request: ModelRequest,
        on_delta: OnDelta,
        on_retry: OnRetry | None = None,
    ) -> ModelResponse:
        """The model's answer to ``request``; raises ProviderError once retries are spent."""
        attempt = 0
        while True:
            try:
                return await self._once(request, on_delta)
            except ProviderError as exc:
                if not exc.retryable or attempt >= self.config.retries:
                    raise named(self.name, self.config, exc) from None
                delay = max(exc.retry_after or 0.0, self.config.backoff * (2**attempt))
                attempt += 1
                if on_retry is not None:
                    on_retry(attempt, exc, delay)
                log.warning(
                    "model request failed; retrying",
                    extra={
                        "model": self.name,
                        "attempt": attempt,
                        "delay": delay,
                        "code": exc.code,
                        "status": exc.status,
                    },
                )
                await asyncio.sleep(delay)

    def _structured(self, request: ModelRequest) -> bool:
        """Whether this step is held to a step object (the output's JSON schema)."""
        cfg = self.config
        return (
            not request.free
            and bool(request.tools)
            and steps.enabled(cfg.structured_steps, cfg.provider, cfg.base_url)
        )

    def _compact(self, request: ModelRequest) -> bool:
        """Whether the step's tools go in the system prompt as compact signatures."""
        cfg = self.config
        if not request.tools or cfg.tool_listing == "native":
            return False
        if cfg.tool_listing == "compact":
            return True
        return steps.enabled(cfg.structured_steps, cfg.provider, cfg.base_url)

    async def _once(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        structured, compact = self._structured(request), self._compact(request)
        if not structured and not compact:
            return await self._plain(request, on_delta, None)
        offered = [str(t["name"]) for t in request.tools]
        schema = steps.schema(request.tools) if structured else None
        if compact:
            listing = signatures.listing(request.tools, steps.reply_name(offered))
            request = msgspec.structs.replace(
                request, system=f"{request.system}\n\n{listing}", tools=()
            )
        # A free step of a compact listing is read the same way: a model shown the step
        # object's shape may write one where nothing holds it to it.
        reply = steps.ReplyText(offered)
        response = await self._plain(request, lambda text: on_delta(reply.feed(text)), schema)
        return steps.read(response, offered, new_call_id())

    async def _plain(
        self, request: ModelRequest, on_delta: OnDelta, schema: dict[str, Any] | None
    ) -> ModelResponse:
        cfg = self.config
        payload = self.wire.body(request, cfg.model, stream=cfg.stream)
        if schema is not None:
            temperature = cfg.step_temperature
            self.wire.constrain(payload, schema, None if temperature == "server" else temperature)
        # Encoded once, by msgspec (json.dumps is several times slower).
        body = _encoder.encode(payload)
        headers = {**JSON_HEADERS, **self.wire.headers(self.api_key())}
        try:
            async with self.http().post(self.wire.path(), body, headers) as response:
                if response.status >= 300:
                    raw = await _head_of(response)
                    raise _status_error(response.status, raw, response.headers.get("retry-after"))
                if not cfg.stream:
                    raw = await response.read(MAX_BODY)
                    try:
                        data = _decoder.decode(raw)
                    except ValueError:
                        raise ProviderError(
                            "model-bad-response",
                            "the model server sent a body that is not JSON",
                            retryable=False,
                        ) from None
                    result = self.wire.parse(data)
                    if result.text:
                        on_delta(result.text)
                    return result
                return await self._stream(response.lines(MAX_LINE), on_delta)
        except HttpError as exc:
            if exc.kind == "invalid":  # a header the configuration made unsendable
                raise ProviderError(
                    "model-rejected", f"the request cannot be sent: {exc}", retryable=False
                ) from None
            if exc.kind == "too-large":
                raise ProviderError(
                    "model-bad-response", f"the model server sent {exc}", retryable=False
                ) from None
            if exc.kind == "timeout":
                raise ProviderError(
                    "model-unreachable",
                    f"the model server did not answer within {cfg.read_timeout:g} s",
                    retryable=True,
                ) from None
            raise ProviderError(
                "model-unreachable",
                f"the model server connection failed ({exc})",
                retryable=True,
            ) from None

    async def _stream(self, lines: AsyncIterator[str], on_delta: OnDelta) -> ModelResponse:
        assembler = self.wire.assembler()
        event = ""
        async for line in lines:
            if self.wire.framing == "ndjson":
                if not line.strip():
                    continue
                chunk = _json_line(line)
            else:
                if line.startswith("event:"):
                    event = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    assembler.feed({"__done__": True})
                    break
                chunk = _json_line(data)
            for delta in assembler.feed(chunk, event):
                on_delta(delta)
            if assembler.complete and self.wire.framing == "ndjson":
                break
        if not assembler.complete:
            raise ProviderError(
                "model-unreachable", "the model server's stream ended early", retryable=True
            )
        await _drain(lines)
        return assembler.finish()


async def _head_of(response: Response) -> bytes:
    """The start of an error body (the rest is dropped with the connection)."""
    out = b""
    with contextlib.suppress(HttpError, TimeoutError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for data in response.chunks():
                out += data
                if len(out) >= MAX_ERROR_BODY:
                    break
    return out


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read what follows the end marker, so the connection goes back to the pool.

    A connection whose response was not read to its end is closed: without
    this every streamed model request would open a new connection. Bounded in
    time and size; a server that keeps sending only loses its connection.
    """
    budget = DRAIN_MAX
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            async for line in lines:
                budget -= len(line) + 1
                if budget < 0:
                    return
    except (TimeoutError, HttpError, ProviderError):
        return


def _json_line(text: str) -> dict[str, Any]:
    try:
        value = _decoder.decode(text)
    except ValueError:
        raise ProviderError(
            "model-bad-response",
            "the model server sent a stream line that is not JSON",
            retryable=False,
        ) from None
    if not isinstance(value, dict):
        raise ProviderError(
            "model-bad-response",
            "the model server sent a stream line that is not an object",
            retryable=False,
        )
    return value
