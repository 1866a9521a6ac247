"""Web search through the configured provider: SearXNG (JSON API), Brave Search API, Tavily.

Each provider's answer is normalised to :class:`Hit` (title, URL, snippet,
date). The key (Brave, Tavily) is read when a search runs, from the
environment variable ``[web.search] api_key_env`` names, else from the
secret :data:`SECRET_ID` in the secrets store; it goes into a request header
only, never into a result, an error message or the log.

The provider's URL is the operator's configuration, not something the model
or a page chose, so it is requested without the SSRF guard (a self-hosted
SearXNG usually runs on this machine or the local network); environment
proxies and redirects are not followed all the same. The *results'* URLs are
fetched by ``web_fetch``, under the guard.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx2

from chalie.calls.untrusted import clean
from chalie.net.loopback import HOST
from chalie.net.tls import tls_context
from chalie.process.config import WebSearchConfig

SECRET_ID: Final = "web.search"
BRAVE_URL: Final = "https://api.search.brave.com/res/v1/web/search"
TAVILY_URL: Final = "https://api.tavily.com/search"
HOW_TO_CONFIGURE: Final = (
    'Set [web.search] in config.toml: provider = "searxng" with url = '
    f'"http://{HOST}:8888" (its JSON format enabled), or provider = "brave" / "tavily" '
    "with api_key_env naming the variable that holds the key."
)
MAX_SNIPPET: Final = 600


class SearchError(Exception):
    def __init__(self, code: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Hit:
    title: str
    url: str
    snippet: str
    date: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "url": self.url, "snippet": self.snippet, "date": self.date}


def _text(value: Any, limit: int = 300) -> str:
    return " ".join(clean(value).split())[:limit] if isinstance(value, str) else ""


def _hits(rows: Any, title: str, url: str, snippet: str, date: str, limit: int) -> list[Hit]:
    if not isinstance(rows, list):
        raise SearchError("search-failed", "the provider's answer has no result list")
    out: list[Hit] = []
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        link = _text(row.get(url), 2048)
        if not link.startswith(("http://", "https://")):
            continue
        out.append(
            Hit(
                title=_text(row.get(title)) or link,
                url=link,
                snippet=_text(row.get(snippet), MAX_SNIPPET),
                date=_text(row.get(date), 40) or None,
            )
        )
        if len(out) >= limit:
            break
    return out


class Searcher:
    """One provider's client; ``key`` is asked for at each search (a rotated key just works)."""

    def __init__(
        self,
        config: WebSearchConfig,
        key: Callable[[], str | None] = lambda: None,
        *,
        user_agent: str = "Chalie",
    ) -> None:
        self.config = config
        self._key = key
        self._client = httpx2.Client(
            verify=tls_context(),
            trust_env=False,
            follow_redirects=False,
            timeout=httpx2.Timeout(config.timeout),
            headers={"User-Agent": user_agent, "Accept": "application/json"},
        )

    def close(self) -> None:
        self._client.close()

    def search(self, query: str, limit: int | None = None) -> list[Hit]:
        cfg = self.config
        wanted = min(limit or cfg.max_results, cfg.max_results)
        if cfg.provider is None:
            raise SearchError(
                "no-search-provider", "no web search provider is configured", HOW_TO_CONFIGURE
            )
        if cfg.provider == "searxng":
            assert cfg.url is not None  # the config checks it
            data = self._get(
                cfg.url.rstrip("/") + "/search", {"q": query, "format": "json"}, headers={}
            )
            rows = data.get("results") if isinstance(data, Mapping) else None
            return _hits(rows, "title", "url", "content", "publishedDate", wanted)
        key = self._need_key()
        if cfg.provider == "brave":
            data = self._get(
                cfg.url or BRAVE_URL,
                {"q": query, "count": str(wanted)},
                headers={"X-Subscription-Token": key},
            )
            web = data.get("web") if isinstance(data, Mapping) else None
            rows = web.get("results") if isinstance(web, Mapping) else None
            return _hits(rows, "title", "url", "description", "page_age", wanted)
        data = self._post(
            cfg.url or TAVILY_URL,
            {"query": query, "max_results": wanted},
            headers={"Authorization": f"Bearer {key}"},
        )
        rows = data.get("results") if isinstance(data, Mapping) else None
        return _hits(rows, "title", "url", "content", "published_date", wanted)

    def _need_key(self) -> str:
        key = self._key()
        if not key:
            where = self.config.api_key_env or "(api_key_env not set)"
            raise SearchError(
                "no-search-provider",
                f"the {self.config.provider} search provider needs an API key",
                f"Put the key in the environment variable {where} of the daemon, or in the "
                f"secrets store as {SECRET_ID}.",
            )
        return key

    def _get(self, url: str, params: dict[str, str], headers: dict[str, str]) -> Any:
        return self._send(lambda: self._client.get(url, params=params, headers=headers))

    def _post(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        return self._send(lambda: self._client.post(url, json=body, headers=headers))

    def _send(self, request: Callable[[], httpx2.Response]) -> Any:
        provider = self.config.provider
        try:
            response = request()
        except httpx2.TimeoutException:
            raise SearchError("search-failed", f"the {provider} search timed out") from None
        except httpx2.HTTPError as exc:
            # The message of a transport error names the host, never a header.
            raise SearchError(
                "search-failed", f"the {provider} search failed: {type(exc).__name__}"
            ) from None
        if response.status_code in (401, 403):
            raise SearchError(
                "search-failed",
                f"the {provider} search refused the key (HTTP {response.status_code})",
                "The operator must check the search provider's API key.",
            )
        if response.status_code == 429:
            raise SearchError(
                "search-failed", f"the {provider} search is rate-limited", "Try again later."
            )
        if response.status_code >= 400:
            raise SearchError(
                "search-failed", f"the {provider} search answered HTTP {response.status_code}"
            )
        try:
            return response.json()
        except ValueError:
            raise SearchError(
                "search-failed", f"the {provider} search did not answer JSON"
            ) from None


def key_reader(
    config: WebSearchConfig, secrets: Callable[[str], str | None]
) -> Callable[[], str | None]:
    """The key, looked up when needed: the environment variable, else the secrets store."""

    def read() -> str | None:
        if config.api_key_env:
            value = os.environ.get(config.api_key_env)
            if value:
                return value
        return secrets(SECRET_ID)

    return read
