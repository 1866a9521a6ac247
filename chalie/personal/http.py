"""HTTP for accounts and services (WebDAV, ICS, Open-Meteo): one client, failures as codes.

Every transport failure becomes an :class:`AccountFailure`: refused, dropped,
timed out or a 5xx is ``account-unreachable``; 401 and 403 are
``auth-failed``; a body over the size limit is ``account-bad-response``. The
URL in a message never carries credentials (they travel in the Authorization
header only), and no response body is quoted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import httpx2

from chalie.accounts.failure import AccountFailure
from chalie.net.tls import tls_context

MAX_BODY: Final = 64 * 1024 * 1024
USER_AGENT: Final = "chalie/0.1 (+personal abilities)"


class Response:
    """What a caller reads of a response: status, headers, the bounded body."""

    __slots__ = ("content", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status = status
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class HttpClient:
    """One httpx2 client for one account or service; ``who`` names it in every failure."""

    def __init__(
        self,
        who: str,
        *,
        username: str = "",
        password: str = "",
        timeout: float = 15.0,
        max_body: int = MAX_BODY,
    ) -> None:
        self.who = who
        self.max_body = max_body
        auth = httpx2.BasicAuth(username, password) if username else None
        self._client = httpx2.Client(
            auth=auth,
            timeout=httpx2.Timeout(timeout),
            follow_redirects=True,
            max_redirects=5,
            headers={"User-Agent": USER_AGENT},
            trust_env=False,
            verify=tls_context(),  # built once: a context of its own costs 15-70 ms a client
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201, 204, 207),
    ) -> Response:
        """One request; AccountFailure unless the status is in ``ok`` (or 404/409/412 asked for)."""
        try:
            with self._client.stream(
                method, url, content=body, headers=dict(headers or {}), params=params
            ) as resp:
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                    if size > self.max_body:
                        raise AccountFailure(
                            "account-bad-response",
                            f"the answer to {method} is over {self.max_body // 2**20} MB",
                            account=self.who,
                        )
                    chunks.append(chunk)
                status, got_headers = resp.status_code, dict(resp.headers)
        except httpx2.TimeoutException:
            raise AccountFailure(
                "account-unreachable", f"{method} timed out", account=self.who
            ) from None
        except (httpx2.TransportError, httpx2.TooManyRedirects) as exc:
            raise AccountFailure(
                "account-unreachable",
                f"{method} failed: {type(exc).__name__}",
                account=self.who,
            ) from None
        except httpx2.InvalidURL:
            raise AccountFailure(
                "account-bad-response", "the URL is malformed", account=self.who
            ) from None
        if status in (401, 403) and status not in ok:
            raise AccountFailure(
                "auth-failed",
                f"the server refused the credentials (HTTP {status})",
                account=self.who,
            )
        if status >= 500:
            raise AccountFailure(
                "account-unreachable", f"the server failed (HTTP {status})", account=self.who
            )
        if status not in ok:
            raise AccountFailure(
                "item-not-found" if status in (404, 410) else "account-bad-response",
                f"{method} answered HTTP {status}",
                account=self.who,
            )
        return Response(status, got_headers, b"".join(chunks))
