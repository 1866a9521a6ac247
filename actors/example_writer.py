"""ExampleWriter: asks the configured model for example requests of tools that arrive without any.

Lifecycle, in order:

1. The DiscoveryActor calls :meth:`ExampleWriter.submit` with the tools an
   update added without examples. ``submit`` only hands them to the daemon's
   event loop and returns: no actor waits on the model.
2. On the loop, each tool's definition hash is looked up in the cache
   (chalie.db): a hit is delivered at once and asks the model nothing.
3. A miss joins a bounded queue; one pump task asks the model for one tool at
   a time, within the budget of tools a minute, validates the answer
   (chalie/discovery/written.py), caches it and delivers it. A failure (an
   HTTP error, an answer that is not a clean list) stores nothing and logs one line.
   :meth:`withdraw` drops the tools that left the index (or changed) from the
   queue: the model is never asked about a tool that is gone.
4. ``deliver`` (the DiscoveryHandle's tell) stores the phrases as the tool's
   model-written examples, if its definition is still the one they were written for.
5. :meth:`close` cancels the pump and closes the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from actors.loop import EventLoopThread
from chalie.discovery.types import ToolDoc
from chalie.discovery.written import (
    Budget,
    WrittenCache,
    WrittenError,
    definition_hash,
    validate_phrases,
    writing_request,
)
from chalie.providers.client import ModelClient
from chalie.providers.types import ProviderError

log = logging.getLogger("chalie.discovery.written")

# Tools waiting for the model, at most; past it the oldest wait is dropped (a
# later reconnect asks again).
MAX_QUEUED: Final = 10_000
# Seconds one request may take, retries included.
REQUEST_TIMEOUT: Final = 120.0

Deliver = Callable[[ToolDoc, list[str]], None]
SchemaOf = Callable[[str], Mapping[str, Any] | None]


class ExampleWriter:
    """Writes example requests for tools in the background; thread-safe ``submit``."""

    def __init__(
        self,
        loop: EventLoopThread,
        client: ModelClient,
        cache: WrittenCache,
        deliver: Deliver,
        *,
        per_minute: int = 10,
        schema_of: SchemaOf = lambda _name: None,
    ) -> None:
        self._loop = loop
        self._client = client
        self._cache = cache
        self._deliver = deliver
        self._schema_of = schema_of
        self._budget = Budget(per_minute)
        # Touched on the loop's thread only.
        self._queue: OrderedDict[str, ToolDoc] = OrderedDict()
        self._pump: asyncio.Task[None] | None = None
        self.asked = 0  # model requests made (tests, status)

    def submit(self, docs: Sequence[ToolDoc]) -> None:
        """Queue tools without examples for writing; returns at once."""
        wanted = [d for d in docs if not d.examples]
        if not wanted:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon(lambda: self._enqueue(wanted))

    def withdraw(self, names: Sequence[str]) -> None:
        """Forget queued tools by name (they left the index or changed); returns at once."""
        gone = set(names)
        if not gone:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon(lambda: self._drop(gone))

    def _drop(self, names: set[str]) -> None:
        for digest in [k for k, doc in self._queue.items() if doc.name in names]:
            del self._queue[digest]

    def _digest(self, doc: ToolDoc) -> str:
        return definition_hash(doc.name, doc.summary, self._schema_of_quietly(doc.name))

    def _enqueue(self, docs: list[ToolDoc]) -> None:
        for doc in docs:
            digest = self._digest(doc)
            cached = self._cache.get(digest)
            if cached is not None:
                self._hand_over(doc, cached)
                continue
            self._queue[digest] = doc
            self._queue.move_to_end(digest)
            while len(self._queue) > MAX_QUEUED:
                self._queue.popitem(last=False)
        if self._queue and (self._pump is None or self._pump.done()):
            self._pump = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._queue:
            wait = self._budget.wait(time.monotonic())
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            digest, doc = self._queue.popitem(last=False)
            self._budget.spend(time.monotonic())
            await self._write(digest, doc)

    async def _write(self, digest: str, doc: ToolDoc) -> None:
        request = writing_request(doc.name, doc.summary, self._schema_of_quietly(doc.name))
        self.asked += 1
        try:
            response = await asyncio.wait_for(
                self._client.complete(request, lambda _text: None), REQUEST_TIMEOUT
            )
            phrases = validate_phrases(response.text)
        except (ProviderError, WrittenError, TimeoutError) as exc:
            log.warning("no model-written examples for %s: %s", doc.name, _one_line(exc))
            return
        except Exception as exc:  # the pump must survive anything one tool does
            log.warning("no model-written examples for %s: %r", doc.name, exc)
            return
        self._cache.put(digest, doc.name, phrases, self._client.config.model)
        self._hand_over(doc, phrases)

    def _schema_of_quietly(self, name: str) -> Mapping[str, Any] | None:
        try:
            return self._schema_of(name)
        except Exception:
            return None

    def _hand_over(self, doc: ToolDoc, phrases: list[str]) -> None:
        try:
            self._deliver(doc, phrases)
        except Exception:
            log.exception("model-written examples for %s not delivered", doc.name)

    def pending(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        """Stop asking (a request in flight is cancelled) and release the cache and the client."""
        pump = self._pump
        with contextlib.suppress(RuntimeError):
            if pump is not None:
                self._loop.call_soon(pump.cancel)
            self._loop.submit(self._client.aclose())
        self._cache.close()


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]
