"""A small HTTP/1.1 client for model servers: keep-alive POSTs whose answer is read as it arrives.

Why our own: a model request is one POST to one origin, read whole or as a
stream of lines. httpx2 spent about 1 ms of the event loop's CPU on each
(request building, pool probing, three layers of async generators, h11),
which made the model client the largest single cost of a turn (a profile
of the daemon under inbound MCP load: 30 % of its CPU). This client does the same work on
asyncio streams in a fraction of that; nothing else in Chalie uses it.

What it does, and what it refuses:

- ``http`` and ``https`` origins (TLS with the system's verification, SNI);
  HTTP/1.1 only; no redirects (a 3xx is handed back as a status), no
  compression (it asks for ``identity``; a compressed answer is refused).
- Through an HTTP proxy when one is given (:func:`proxy_from_environment`
  reads the standard ``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY`` and
  ``NO_PROXY``; a loopback origin never goes through one): an ``http``
  origin's request goes to the proxy in absolute form, an ``https`` one
  through a ``CONNECT`` tunnel, TLS to the origin inside it.
- Bodies framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or the
  connection's end; 1xx interim answers are skipped.
- Keep-alive: a connection goes back to the pool only when its response was
  read to the end and neither side said ``close``; at most
  ``max_connections`` are open, further requests wait up to
  ``pool_timeout``. A request on a kept-alive connection that the server had
  already closed (no byte of an answer) is sent once more on a new one.
- Limits: status line and headers 64 KiB, 100 header lines, a line of a
  streamed body ``max_line`` bytes; a chunk size that is not hex, a header
  line without a colon, a bad status line: :class:`HttpError` ``protocol``.
- Timeouts: connect, each read (``read_timeout`` without a byte is a
  timeout), each write. A header name or value holding CR, LF or NUL is
  refused before anything is sent.

Errors are :class:`HttpError` with a ``kind`` (``connect``, ``timeout``,
``protocol``, ``closed``, ``too-large``, and ``invalid`` for a request that
cannot be sent); their text never holds a header value.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import unquote, urlsplit

import chalie
from chalie.net.loopback import is_loopback
from chalie.net.tls import tls_context

MAX_HEAD: Final = 64 * 1024
MAX_HEADERS: Final = 100
MAX_CHUNK_LINE: Final = 1024
READ_SIZE: Final = 64 * 1024
USER_AGENT: Final = f"chalie/{chalie.__version__}"
ErrorKind = Literal["connect", "timeout", "protocol", "closed", "too-large", "invalid"]
_FORBIDDEN: Final = frozenset("\r\n\0")


class HttpError(Exception):
    """A request that failed below HTTP: ``kind`` says how; the message is safe to show."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    path: str  # the base path, without a trailing slash

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if parts.username or parts.password:
            raise ValueError("a model URL must not carry credentials; use api_key_env")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"bad port in {url!r}") from None
        default = 443 if parts.scheme == "https" else 80
        return cls(parts.scheme, parts.hostname, port or default, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: where it listens and the ``Proxy-Authorization`` its URL carried."""

    host: str
    port: int
    authorization: str | None = None

    @classmethod
    def parse(cls, url: str) -> Proxy:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only an http:// proxy is supported, not {parts.scheme}://")
        try:
            port = parts.port or 80
        except ValueError:
            raise ValueError("a proxy URL with a bad port") from None
        auth = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        return cls(parts.hostname, port, auth)


def proxy_from_environment(url: str) -> Proxy | None:
    """The proxy the standard variables name for ``url``; None: connect directly.

    ``HTTPS_PROXY`` / ``HTTP_PROXY`` by the URL's scheme, else ``ALL_PROXY``
    (either case); ``NO_PROXY`` as curl and Python read it. A loopback host
    never goes through a proxy. A proxy URL that cannot be used is a ValueError.
    """
    origin = Origin.parse(url)
    if origin.loopback:
        return None
    proxies = urllib.request.getproxies_environment()
    chosen = proxies.get(origin.scheme) or proxies.get("all")
    if not chosen or urllib.request.proxy_bypass(origin.host):
        return None
    return Proxy.parse(chosen)


class _Conn:
    __slots__ = ("reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    @property
    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Response:
    """One answer: ``status``, ``headers`` (lower-case names), then its body, read once."""

    def __init__(
        self,
        client: HttpClient,
        conn: _Conn,
        status: int,
        headers: dict[str, str],
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.headers = headers
        self._client = client
        self._conn: _Conn | None = conn
        self._keep_alive = keep_alive
        self._done = False
        encoding = headers.get("transfer-encoding", "").lower()
        if encoding:
            if encoding.split(",")[-1].strip() != "chunked":
                raise HttpError("protocol", f"unsupported transfer encoding {encoding[:40]!r}")
            self._mode, self._left = "chunked", 0
        elif "content-length" in headers:
            text = headers["content-length"]
            if not text.isdigit() or len(text) > 18:
                raise HttpError("protocol", "a bad Content-Length")
            self._mode, self._left = "length", int(text)
        else:
            self._mode, self._left = "close", 0
            self._keep_alive = False
        if headers.get("content-encoding", "identity").lower() not in ("identity", ""):
            raise HttpError("protocol", "the server sent a compressed body")
        if status in (204, 304) or 100 <= status < 200:
            self._mode, self._left = "length", 0

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; the connection goes back to the pool at the end."""
        conn = self._conn
        if conn is None or self._done:
            return
        reader, timeout = conn.reader, self._client.read_timeout
        try:
            if self._mode == "length":
                left = self._left
                while left > 0:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(min(left, READ_SIZE))
                    if not data:
                        raise HttpError("closed", "the server closed the connection mid-body")
                    left -= len(data)
                    yield data
            elif self._mode == "chunked":
                async for data in _dechunk(reader, timeout):
                    yield data
            else:
                while True:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(READ_SIZE)
                    if not data:
                        break
                    yield data
        except TimeoutError:
            self._discard()
            raise HttpError("timeout", f"no data from the server within {timeout:g} s") from None
        except asyncio.IncompleteReadError:
            self._discard()
            raise HttpError("closed", "the server closed the connection mid-body") from None
        except (ConnectionError, OSError) as exc:
            self._discard()
            raise HttpError("closed", f"the connection failed ({type(exc).__name__})") from None
        except BaseException:
            self._discard()
            raise
        self._done = True
        self._release()

    async def lines(self, max_line: int) -> AsyncIterator[str]:
        """The body as text lines (LF or CRLF), each at most ``max_line`` bytes."""
        pending = b""
        async for data in self.chunks():
            pending += data
            start = 0
            while True:
                end = pending.find(b"\n", start)
                if end < 0:
                    break
                yield _text(pending[start:end], max_line)
                start = end + 1
            pending = pending[start:]
            if len(pending) > max_line:
                raise HttpError("too-large", "a line longer than the limit")
        if pending:
            yield _text(pending, max_line)

    async def read(self, limit: int) -> bytes:
        """The whole body, refusing one larger than ``limit`` bytes."""
        out = bytearray()
        async for data in self.chunks():
            out += data
            if len(out) > limit:
                self._discard()
                raise HttpError("too-large", f"a body larger than {limit} bytes")
        return bytes(out)

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._give_back(conn, self._keep_alive and conn.usable)

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._give_back(conn, False)

    def close(self) -> None:
        """End the response; a body not read to its end closes the connection."""
        if self._done:
            self._release()
        else:
            self._discard()


class HttpClient:
    """Connections to one origin, used on one event loop; see the module docstring."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        write_timeout: float = 30.0,
        pool_timeout: float = 30.0,
        max_connections: int = 256,
        tls: ssl.SSLContext | None = None,
        proxy: Proxy | None = None,
    ) -> None:
        self.origin = Origin.parse(base_url)
        self.proxy = proxy
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.pool_timeout = pool_timeout
        self._tls = tls
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._open = 0
        self._closed = False

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
            self._open -= 1

    def post(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> contextlib.AbstractAsyncContextManager[Response]:
        """POST ``body`` to the base URL's path plus ``path``; the response, headers read."""
        return self.request("POST", path, body, headers)

    def get(
        self, path: str, headers: Mapping[str, str]
    ) -> contextlib.AbstractAsyncContextManager[Response]:
        """GET the base URL's path plus ``path``; the response, headers read."""
        return self.request("GET", path, b"", headers)

    @contextlib.asynccontextmanager
    async def request(
        self, method: Literal["GET", "POST"], path: str, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[Response]:
        """Send one request; the response, headers read (its body is read from it)."""
        if self._closed:
            raise HttpError("closed", "the client is closed")
        head = self._head(method, path, len(body), headers)
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.pool_timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise HttpError("timeout", "no free connection to the model server") from None
        else:
            await self._slots.acquire()  # free: returns at once
        response: Response | None = None
        try:
            response = await self._exchange(head, body)
            yield response
        finally:
            if response is not None:
                response.close()
            self._slots.release()

    def _head(self, method: str, path: str, length: int, headers: Mapping[str, str]) -> bytes:
        origin = self.origin
        target = origin.path + (path if path.startswith("/") else "/" + path)
        if _FORBIDDEN.intersection(target) or " " in target:
            raise HttpError("invalid", "a request path must not hold spaces or control characters")
        proxied = self.proxy is not None and origin.scheme == "http"
        lines = [
            # Through a proxy, a plain-http request names its origin (absolute form).
            f"{method} {f'http://{origin.host_header}' if proxied else ''}{target} HTTP/1.1",
            f"Host: {origin.host_header}",
            f"User-Agent: {USER_AGENT}",
            "Accept-Encoding: identity",
        ]
        if method != "GET" or length:
            lines.append(f"Content-Length: {length}")
        if proxied and self.proxy is not None and self.proxy.authorization:
            lines.append(f"Proxy-Authorization: {self.proxy.authorization}")
        for name, value in headers.items():
            if not name or _FORBIDDEN.intersection(name) or ":" in name:
                raise HttpError("invalid", "a header name must not hold ':' or control characters")
            if _FORBIDDEN.intersection(value):
                raise HttpError(
                    "invalid", f"the value of header {name!r} holds a control character"
                )
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _exchange(self, head: bytes, body: bytes) -> Response:
        while True:
            conn = await self._connection()
            try:
                return await self._send(conn, head, body)
            except HttpError as exc:
                self._give_back(conn, False)
                if conn.reused and exc.kind == "closed":
                    continue  # the server had closed a kept-alive connection: once more, anew
                raise
            except BaseException:
                self._give_back(conn, False)
                raise

    async def _connection(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                conn.reused = True
                return conn
            conn.close()
            self._open -= 1
        origin, proxy = self.origin, self.proxy
        tls: ssl.SSLContext | None = None
        if origin.scheme == "https":
            tls = self._tls or tls_context()
        where = "the model server" if proxy is None else f"the proxy {proxy.host}:{proxy.port}"
        try:
            async with asyncio.timeout(self.connect_timeout):
                if proxy is None:
                    reader, writer = await asyncio.open_connection(
                        origin.host,
                        origin.port,
                        ssl=tls,
                        server_hostname=origin.host if tls is not None else None,
                        limit=MAX_HEAD,
                    )
                else:
                    reader, writer = await asyncio.open_connection(
                        proxy.host, proxy.port, limit=MAX_HEAD
                    )
                    if tls is not None:
                        try:
                            await _tunnel(reader, writer, origin, proxy)
                            await writer.start_tls(tls, server_hostname=origin.host)
                        except BaseException:
                            writer.close()
                            raise
        except TimeoutError:
            raise HttpError(
                "timeout", f"no connection to {where} within {self.connect_timeout:g} s"
            ) from None
        except ssl.SSLError as exc:
            raise HttpError("connect", f"TLS failed ({exc.reason or type(exc).__name__})") from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            raise HttpError("connect", f"{where} closed the tunnel before answering") from None
        except OSError as exc:
            raise HttpError(
                "connect", f"cannot connect to {where} ({exc.strerror or exc})"
            ) from None
        self._open += 1
        return _Conn(reader, writer)

    def _give_back(self, conn: _Conn, keep: bool) -> None:
        if keep and not self._closed:
            self._idle.append(conn)
        else:
            conn.close()
            self._open -= 1

    async def _send(self, conn: _Conn, head: bytes, body: bytes) -> Response:
        writer, reader = conn.writer, conn.reader
        try:
            writer.write(head + body if len(body) < READ_SIZE else head)
            if len(body) >= READ_SIZE:
                writer.write(body)
            if writer.transport.get_write_buffer_size():  # else drain() would return at once
                async with asyncio.timeout(self.write_timeout):
                    await writer.drain()
        except TimeoutError:
            raise HttpError("timeout", "the model server did not take the request") from None
        except (ConnectionError, OSError):
            raise HttpError("closed", "the connection closed while sending") from None
        try:
            while True:
                async with asyncio.timeout(self.read_timeout):
                    raw = await reader.readuntil(b"\r\n\r\n")
                status, headers, keep_alive = _parse_head(raw)
                if 100 <= status < 200 and status != 101:
                    continue  # an interim answer; the real one follows
                return Response(self, conn, status, headers, keep_alive)
        except TimeoutError:
            raise HttpError(
                "timeout", f"the model server did not answer within {self.read_timeout:g} s"
            ) from None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise HttpError("protocol", "the server closed the connection mid-answer") from None
            raise HttpError("closed", "the server closed the connection, no answer") from None
        except asyncio.LimitOverrunError:
            raise HttpError("too-large", "the answer's headers are too large") from None
        except (ConnectionError, OSError):
            raise HttpError("closed", "the connection failed before an answer") from None


async def _tunnel(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, origin: Origin, proxy: Proxy
) -> None:
    """Ask the proxy for a tunnel to the origin (``CONNECT``); HttpError unless it answers 2xx."""
    host = f"[{origin.host}]" if ":" in origin.host else origin.host
    target = f"{host}:{origin.port}"
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}", f"User-Agent: {USER_AGENT}"]
    if proxy.authorization:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    status, _, _ = _parse_head(await reader.readuntil(b"\r\n\r\n"))
    if not 200 <= status < 300:
        raise HttpError(
            "connect", f"the proxy {proxy.host}:{proxy.port} refused the tunnel (HTTP {status})"
        )


async def _dechunk(reader: asyncio.StreamReader, timeout: float) -> AsyncIterator[bytes]:
    """A chunked body's data, one piece per read from the socket (not one per chunk).

    A state machine over a buffer: a stream of many small chunks (a model's
    tokens) costs one await per TCP read instead of two per chunk.
    """
    buf, pos = b"", 0
    state, left = _SIZE, 0
    out: list[bytes] = []
    while True:
        if state == _SIZE or state == _TRAILER:
            end = buf.find(b"\n", pos)
            if end >= 0:
                line, pos = buf[pos:end], end + 1
                if state == _SIZE:
                    left = _chunk_size(line)
                    state = _DATA if left else _TRAILER
                elif not line.strip():
                    break  # the empty line after the trailers: the body's end
                continue
            if len(buf) - pos > (MAX_CHUNK_LINE if state == _SIZE else MAX_HEAD):
                raise HttpError("protocol", "a framing line is too long")
        elif state == _DATA:
            if pos < len(buf):
                take = min(left, len(buf) - pos)
                out.append(buf[pos : pos + take])
                pos += take
                left -= take
                if not left:
                    state = _CRLF
                continue
        elif len(buf) - pos >= 2:  # _CRLF
            if buf[pos : pos + 2] != b"\r\n":
                raise HttpError("protocol", "a chunk without its CRLF")
            pos += 2
            state = _SIZE
            continue
        if out:
            yield b"".join(out)
            out.clear()
        async with asyncio.timeout(timeout):
            data = await reader.read(READ_SIZE)
        if not data:
            raise HttpError("closed", "the server closed the connection mid-body")
        buf, pos = buf[pos:] + data, 0
    if out:
        yield b"".join(out)


_SIZE, _DATA, _CRLF, _TRAILER = range(4)


def _parse_head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    text = raw.decode("latin-1")
    lines = text.split("\r\n")
    status_line = lines[0].split(" ", 2)
    if (
        len(status_line) < 2
        or status_line[0] not in ("HTTP/1.1", "HTTP/1.0")
        or len(status_line[1]) != 3
        or not status_line[1].isdigit()
    ):
        raise HttpError("protocol", "the server's answer is not HTTP/1.x")
    status = int(status_line[1])
    headers: dict[str, str] = {}
    fields = [line for line in lines[1:] if line]
    if len(fields) > MAX_HEADERS:
        raise HttpError("protocol", "the answer has too many headers")
    for line in fields:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError("protocol", "a malformed header line in the answer")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    connection = headers.get("connection", "").lower()
    if status_line[0] == "HTTP/1.0":
        keep_alive = "keep-alive" in connection
    else:
        keep_alive = "close" not in connection
    return status, headers, keep_alive


def _chunk_size(line: bytes) -> int:
    text = line.split(b";", 1)[0].strip()
    if not text or len(text) > 15:
        raise HttpError("protocol", "a bad chunk size")
    try:
        return int(text, 16)
    except ValueError:
        raise HttpError("protocol", "a bad chunk size") from None


def _text(raw: bytes, max_line: int) -> str:
    if len(raw) > max_line:
        raise HttpError("too-large", "a line longer than the limit")
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError("protocol", "a line that is not UTF-8") from None
