"""One language model over HTTP: a request, streamed or whole, retried where retrying helps.

Runs on the daemon's event loop (``async``). Written directly on httpx2 (the
client mcp already brings): the three formats are a few lines of framing
each, an SDK would add an import of about a second, its own retries (one 429
becoming three requests) and about 0.5 ms a call.

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
   so the user sees it.
5. Cancelling the task closes the HTTP stream (httpx2 closes the
   connection on exit from ``stream()``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import httpx2
import msgspec

from chalie.config import ModelConfig
from chalie.providers.types import ModelRequest, ModelResponse, ProviderError, parse_retry_after
from chalie.providers.wire import WIRES, Wire

log = logging.getLogger("chalie.providers")

MAX_ERROR_BODY: Final = 300
MAX_LINE: Final = 4 * 1024 * 1024
# Connections kept open to one model server: up to POOLS pools of POOL_CONNECTIONS each
# (httpx2's default kept 20 alive of 100: with more turns in flight than 20 every further
# request opened, and closed, a connection).
POOLS: Final = 16
POOL_CONNECTIONS: Final = 16
DRAIN_MAX: Final = 64 * 1024
DRAIN_SECONDS: Final = 1.0
JSON_HEADERS: Final = {"Content-Type": "application/json"}
_encoder = msgspec.json.Encoder()

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


class ModelClient:
    """A configured model (one ``[models.NAME]``); its connection pools, used on one loop.

    The connections are split over a few small pools, filled in order: httpx2
    probes every idle connection of a pool on each request, so one pool of a
    hundred kept-alive connections costs a hundred socket probes a request.
    A quiet daemon uses the first pool only (its connection stays warm).
    """

    def __init__(self, name: str, config: ModelConfig) -> None:
        self.name = name
        self.config = config
        self.wire: Wire = WIRES[config.provider]
        self._pools: list[httpx2.AsyncClient] = []
        self._busy: list[int] = []

    def _new_pool(self) -> httpx2.AsyncClient:
        cfg = self.config
        return httpx2.AsyncClient(
            base_url=cfg.base_url.rstrip("/"),
            timeout=httpx2.Timeout(
                connect=cfg.connect_timeout, read=cfg.read_timeout, write=30.0, pool=30.0
            ),
            limits=httpx2.Limits(
                max_connections=POOL_CONNECTIONS, max_keepalive_connections=POOL_CONNECTIONS
            ),
            trust_env=False,
        )

    def _pick(self) -> int:
        """The first pool with room (a new one, or else the least busy): its index, counted."""
        free = next((i for i, busy in enumerate(self._busy) if busy < POOL_CONNECTIONS), None)
        if free is None and len(self._pools) < POOLS:
            self._pools.append(self._new_pool())
            self._busy.append(0)
            free = len(self._pools) - 1
        if free is None:
            free = self._busy.index(min(self._busy))
        self._busy[free] += 1
        return free

    async def aclose(self) -> None:
        pools, self._pools, self._busy = self._pools, [], []
        for pool in pools:
            await pool.aclose()

    def _api_key(self) -> str | None:
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
                    raise
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

    async def _once(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        cfg = self.config
        # Encoded once, by msgspec (httpx2's json= runs json.dumps, several times slower).
        body = _encoder.encode(self.wire.body(request, cfg.model, stream=cfg.stream))
        headers = {**JSON_HEADERS, **self.wire.headers(self._api_key())}
        index = self._pick()
        pool = self._pools[index]
        try:
            async with pool.stream(
                "POST", self.wire.path(), content=body, headers=headers
            ) as response:
                if response.status_code >= 300:
                    raw = await response.aread()
                    raise _status_error(
                        response.status_code, raw, response.headers.get("retry-after")
                    )
                if not cfg.stream:
                    raw = await response.aread()
                    try:
                        data = json.loads(raw)
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
                return await self._stream(response, on_delta)
        except httpx2.TimeoutException:
            raise ProviderError(
                "model-unreachable",
                f"the model server did not answer within {cfg.read_timeout:g} s",
                retryable=True,
            ) from None
        except (httpx2.ConnectError, httpx2.RemoteProtocolError, httpx2.ReadError) as exc:
            raise ProviderError(
                "model-unreachable",
                f"the model server connection failed ({type(exc).__name__})",
                retryable=True,
            ) from None
        except httpx2.HTTPError as exc:
            raise ProviderError(
                "model-unreachable",
                f"the model request failed ({type(exc).__name__})",
                retryable=True,
            ) from None
        finally:
            if index < len(self._pools) and self._pools[index] is pool:
                self._busy[index] -= 1

    async def _stream(self, response: httpx2.Response, on_delta: OnDelta) -> ModelResponse:
        assembler = self.wire.assembler()
        event = ""
        lines = response.aiter_lines()
        async for line in lines:
            if len(line) > MAX_LINE:
                raise ProviderError(
                    "model-bad-response",
                    "the model server sent an oversized line",
                    retryable=False,
                )
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


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read what follows the end marker, so the connection goes back to the pool.

    httpx2 closes a connection whose response was not read to its end: without
    this every streamed model request opened a new connection. Bounded in time
    and size; a server that keeps sending only loses its connection.
    """
    budget = DRAIN_MAX
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            async for line in lines:
                budget -= len(line) + 1
                if budget < 0:
                    return
    except (TimeoutError, httpx2.HTTPError):
        return


def _json_line(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
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
