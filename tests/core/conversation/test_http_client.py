"""chalie.providers.http on real sockets: a loopback server answering with scripted bytes."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from chalie.providers.http import HttpClient, HttpError, Proxy
from tools.forward_proxy import ForwardProxy

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


class Server:
    """A loopback server on the test's loop; ``connections`` counts accepted sockets."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}/v1"


CLIENTS: list[HttpClient] = []


def client(url: str, **kw: Any) -> HttpClient:
    kw.setdefault("connect_timeout", 5.0)
    kw.setdefault("read_timeout", 5.0)
    http = HttpClient(url, **kw)
    CLIENTS.append(http)
    return http


async def bodies(http: HttpClient, times: int) -> list[bytes]:
    """POST ``times`` times, one after the other; each answer's body."""
    out = []
    for _ in range(times):
        async with http.post("/x", b"", {}) as resp:
            out.append(await resp.read(100))
    return out


def run(coro: Awaitable[Any]) -> Any:
    """Run a scenario, then close every client it made, on its loop."""

    async def main() -> Any:
        try:
            return await coro
        finally:
            while CLIENTS:
                await CLIENTS.pop().aclose()

    return asyncio.run(main())


def test_keep_alive_reuses_one_connection_and_sends_a_proper_request() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            server.requests.append(head + body)
            writer.write(ok(b'{"n": %d}' % len(server.requests)))

    server = Server(handler)

    async def scenario() -> list[bytes]:
        async with server:
            http = client(server.url)
            out = []
            for _ in range(3):
                async with http.post("/chat", b'{"a":1}', {"X-Key": "k"}) as resp:
                    assert resp.status == 200
                    out.append(await resp.read(1000))
            assert http.open_connections == 1
            await http.aclose()
            return out

    assert run(scenario()) == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    assert server.connections == 1
    first = server.requests[0].decode()
    assert first.startswith("POST /v1/chat HTTP/1.1\r\n")
    assert "Host: 127.0.0.1:" in first and "Content-Length: 7" in first
    assert "X-Key: k" in first and first.endswith('{"a":1}')


def test_chunked_lines_arrive_split_anywhere_with_extensions_and_trailers() -> None:
    body = [b"data: a\n", b"\ndata: b\r", b"\n\ndone"]
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in body)
    wire += b"0\r\nX-Trailer: t\r\n\r\n"
    pieces = [wire[i : i + 5] for i in range(0, len(wire), 5)]  # split anywhere

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        await read_request(reader)  # the connection stays usable
        writer.write(ok(b"again"))

    server = Server(handler)

    async def scenario() -> tuple[list[str], bytes]:
        async with server:
            http = client(server.url)
            async with http.post("/s", b"", {}) as resp:
                lines = [line async for line in resp.lines(1000)]
            async with http.post("/s", b"", {}) as resp:
                again = await resp.read(100)
            return lines, again

    lines, again = run(scenario())
    assert lines == ["data: a", "", "data: b", "", "done"]
    assert again == b"again" and server.connections == 1


def test_a_large_chunk_arrives_in_pieces_and_whole() -> None:
    payload = bytes(range(256)) * 800  # 200 KiB in one chunk, written in 7 KiB pieces
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i in range(0, len(wire), 7 * 1024):
            writer.write(wire[i : i + 7 * 1024])
            await writer.drain()
        await reader.read()

    server = Server(handler)

    async def scenario() -> tuple[int, bytes]:
        async with server:
            async with client(server.url).post("/x", b"", {}) as resp:
                pieces = [piece async for piece in resp.chunks()]
            return len(pieces), b"".join(pieces)

    count, body = run(scenario())
    assert body == payload and count > 1


def test_a_body_to_the_end_of_the_connection_and_connection_close_are_not_reused() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answers[server.connections - 1])

    server = Server(handler)

    async def scenario() -> list[bytes]:
        async with server:
            http = client(server.url)
            out = await bodies(http, 2)
            assert http.open_connections == 0
            return out

    assert run(scenario()) == [b"until the end", b"hi"]
    assert server.connections == 2


def test_a_kept_alive_connection_the_server_closed_is_replaced_without_an_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"one"))
        await writer.drain()
        # then close without a word, as an idle-timeout would

    server = Server(handler)

    async def scenario() -> list[bytes]:
        async with server:
            return await bodies(client(server.url), 3)

    assert run(scenario()) == [b"one", b"one", b"one"]
    assert server.connections == 3


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (b"", "closed"),
        (b"SMTP ready\r\n\r\n", "protocol"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "protocol"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, "protocol"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "closed"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx", "protocol"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "too-large"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n" + b"z" * 3000, "too-large"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\xff\xfe", "protocol"),
    ],
)
def test_a_broken_or_hostile_answer_is_a_clean_error(answer: bytes, kind: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()

    server = Server(handler)

    async def scenario() -> HttpError:
        async with server:
            http = client(server.url)
            with pytest.raises(HttpError) as caught:
                async with http.post("/x", b"", {}) as resp:
                    if b"\xff" in answer:
                        [line async for line in resp.lines(1000)]
                    else:
                        await resp.read(2000)
            # a broken connection is never pooled; a whole body whose text is bad leaves it sound
            assert http.open_connections == http.idle_connections == (b"\xff" in answer)
            return caught.value

    assert run(scenario()).kind == kind


def test_an_interim_answer_is_skipped_and_an_error_status_is_handed_back() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(b"HTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nContent-Length: 4\r\n\r\nslow")

    server = Server(handler)

    async def scenario() -> tuple[int, str, bytes]:
        async with server:
            async with client(server.url).post("/x", b"", {}) as resp:
                return resp.status, resp.headers["retry-after"], await resp.read(10)

    assert run(scenario()) == (429, "3", b"slow")


def test_a_silent_server_is_a_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # never answers; returns when the client gives up

    server = Server(handler)

    async def scenario() -> HttpError:
        async with server:
            with pytest.raises(HttpError) as caught:
                async with client(server.url, read_timeout=0.2).post("/x", b"", {}):
                    pass
            return caught.value

    err = run(scenario())
    assert err.kind == "timeout" and "0.2 s" in str(err)


@pytest.mark.parametrize(
    "headers",
    [{"X-Key": "a\r\nInjected: 1"}, {"Bad\nName": "v"}, {"X": "nul\0"}, {"": "empty"}],
)
def test_a_header_that_would_split_the_request_is_refused_before_connecting(
    headers: dict[str, str],
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise AssertionError("nothing may reach the server")

    server = Server(handler)

    async def scenario() -> None:
        async with server:
            with pytest.raises(HttpError) as caught:
                async with client(server.url).post("/x", b"", headers):
                    pass
            assert caught.value.kind == "invalid"

    run(scenario())
    assert server.connections == 0


def test_no_connection_is_a_connect_error_and_bad_urls_are_refused() -> None:
    async def scenario() -> HttpError:
        with pytest.raises(HttpError) as caught:
            async with client("http://127.0.0.1:9/v1").post("/x", b"", {}):
                pass
        return caught.value

    assert run(scenario()).kind == "connect"
    for bad in ("ftp://host/", "http://", "http://user:pw@host/", "http://host:99999/"):
        with pytest.raises(ValueError):
            HttpClient(bad, connect_timeout=1, read_timeout=1)


def test_the_pool_bounds_connections_and_a_response_left_unread_frees_its_slot() -> None:
    gate = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf ")
            await writer.drain()
            await gate.wait()
            writer.write(b"done!")

    server = Server(handler)

    async def scenario() -> None:
        async with server:
            http = client(server.url, max_connections=1, pool_timeout=0.2)
            async with http.post("/x", b"", {}) as resp:
                assert resp.status == 200
                with pytest.raises(HttpError) as caught:
                    async with http.post("/y", b"", {}):
                        pass
                assert caught.value.kind == "timeout"
            # left unread: its connection is closed, the slot is free again
            assert http.open_connections == 0
            gate.set()
            async with http.post("/z", b"", {}) as resp:
                assert await resp.read(100) == b"half done!"

    run(scenario())
    assert server.connections == 2


def _self_signed(tmp: Path, name: str = "IP:127.0.0.1") -> tuple[Path, Path] | None:
    if shutil.which("openssl") is None:
        return None
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name.split(':', 1)[1]}",
            "-addext",
            f"subjectAltName={name}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _tls_server(tmp: Path, name: str = "IP:127.0.0.1") -> tuple[Path, ssl.SSLContext]:
    """A server's TLS context with a fresh self-signed certificate for ``name``, and the cert."""
    pair = _self_signed(tmp, name)
    if pair is None:
        pytest.skip("openssl is not installed")
    cert, key = pair
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    return cert, server_ctx


def test_tls_is_verified_against_the_trusted_roots(tmp_path: Path) -> None:
    cert, server_ctx = _tls_server(tmp_path)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"secure"))
        await writer.drain()
        await reader.read()

    server = Server(handler, tls=server_ctx)

    async def scenario() -> tuple[bytes, HttpError]:
        async with server:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with client(server.url, tls=trusting).post("/x", b"", {}) as resp:
                body = await resp.read(100)
            with pytest.raises(HttpError) as caught:  # the default roots do not know it
                async with client(server.url).post("/x", b"", {}):
                    pass
            return body, caught.value

    body, err = run(scenario())
    assert body == b"secure"
    assert err.kind == "connect" and "TLS" in str(err)


def test_an_https_origin_goes_through_a_connect_tunnel_tls_to_the_origin_inside(
    tmp_path: Path,
) -> None:
    cert, server_ctx = _tls_server(tmp_path, "DNS:model.test")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        writer.write(ok(head.split(b"\r\n")[0]))
        await writer.drain()
        await reader.read()

    server = Server(handler, tls=server_ctx)

    async def scenario() -> tuple[bytes, list[str], list[str | None], HttpError]:
        async with server:
            port = int(server.url.rsplit(":", 1)[1].split("/")[0])
            trusting = ssl.create_default_context(cafile=str(cert))
            with ForwardProxy(("127.0.0.1", port)) as proxy:
                via = Proxy("127.0.0.1", proxy.port, "Basic eDp5")
                http = client("https://model.test:8443/v1", tls=trusting, proxy=via)
                async with http.get("/models", {}) as resp:
                    body = await resp.read(100)
                seen, auths = list(proxy.seen), list(proxy.authorizations)
            with pytest.raises(HttpError) as caught:  # the proxy is gone
                async with client("https://model.test/v1", tls=trusting, proxy=via).get("/m", {}):
                    pass
            return body, seen, auths, caught.value

    body, seen, auths, err = run(scenario())
    assert body == b"GET /v1/models HTTP/1.1"  # inside the tunnel: origin-form, over TLS
    assert seen == ["CONNECT model.test:8443 HTTP/1.1"]
    assert auths == ["Basic eDp5"]
    assert err.kind == "connect" and "the proxy 127.0.0.1:" in str(err)
