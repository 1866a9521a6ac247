"""search against a SearXNG-shaped endpoint on loopback; Brave and Tavily shapes; no provider."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abilities.search import Search
from chalie.calls import untrusted
from chalie.calls.envelope import parse, render
from chalie.process.config import Config
from chalie.web.kit import WebKit
from tests.core.web.kit import call
from tests.core.web.site import SearxNG
from tools.http_servers import SERVER_POLL


def rows(q: str) -> list[dict[str, Any]]:
    return [
        {
            "title": f"About {q}",
            "url": "https://a.example/1",
            "content": "First \u202esnippet",
            "publishedDate": "2026-02-01",
        },
        {"title": "No URL", "content": "dropped"},
        {"title": "Bad scheme", "url": "javascript:alert(1)", "content": "dropped"},
        {"title": "", "url": "https://b.example/2", "content": "x" * 5000},
    ]


@pytest.fixture
def searx() -> Iterator[SearxNG]:
    engine = SearxNG(rows)
    yield engine
    engine.stop()


def kit_for(tmp: Path, search: dict[str, Any]) -> WebKit:
    config = Config.from_mapping({"web": {"search": search}}, home=tmp)
    return WebKit(config.web, home=tmp)


def test_searxng_results_are_normalised_and_untrusted(searx: SearxNG, tmp_path: Path) -> None:
    kit = kit_for(tmp_path, {"provider": "searxng", "url": searx.url})
    try:
        result = call(Search, kit, query="  valletta   harbour ")
    finally:
        kit.close()
    assert searx.queries == ["valletta harbour"]
    assert untrusted.is_marked(result) and result.meta["count"] == 2
    hits = json.loads(parse(render("search", result))[0].content.split("\n", 1)[1])
    assert hits[0] == {
        "title": "About valletta harbour",
        "url": "https://a.example/1",
        "snippet": "First snippet",
        "date": "2026-02-01",
    }
    assert hits[1]["title"] == "https://b.example/2" and len(hits[1]["snippet"]) == 600
    assert result.rich == {"results": hits}


def test_no_provider_says_how_to_configure_one(tmp_path: Path) -> None:
    kit = kit_for(tmp_path, {})
    result = call(Search, kit, query="anything")
    assert result.code == "no-search-provider"
    assert result.hint is not None and 'provider = "searxng"' in result.hint


def test_a_key_is_required_and_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kit = kit_for(tmp_path, {"provider": "brave", "api_key_env": "CHALIE_TEST_BRAVE_KEY"})
    monkeypatch.delenv("CHALIE_TEST_BRAVE_KEY", raising=False)
    result = call(Search, kit, query="x")
    assert result.code == "no-search-provider" and "CHALIE_TEST_BRAVE_KEY" in (result.hint or "")


def _shaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: str, answer: dict[str, Any]
) -> tuple[Any, list[dict[str, str]]]:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _answer
        do_POST = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(SERVER_POLL,), daemon=True).start()
    monkeypatch.setenv("CHALIE_TEST_KEY", "sk-very-secret-123")
    kit = kit_for(
        tmp_path,
        {
            "provider": provider,
            "url": f"http://127.0.0.1:{httpd.server_address[1]}/s",
            "api_key_env": "CHALIE_TEST_KEY",
        },
    )
    try:
        return call(Search, kit, query="q"), seen
    finally:
        kit.close()
        httpd.shutdown()
        httpd.server_close()


def test_brave_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {
        "web": {
            "results": [
                {
                    "title": "B",
                    "url": "https://b.example/",
                    "description": "d",
                    "page_age": "2026-01-01",
                }
            ]
        }
    }
    result, seen = _shaped(tmp_path, monkeypatch, "brave", answer)
    assert seen[0]["x-subscription-token"] == "sk-very-secret-123"
    assert '"url":"https://b.example/","snippet":"d","date":"2026-01-01"' in result.body
    assert "sk-very-secret" not in result.body + json.dumps(result.rich) + str(dict(result.meta))


def test_tavily_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {"results": [{"title": "T", "url": "https://t.example/", "content": "c"}]}
    result, seen = _shaped(tmp_path, monkeypatch, "tavily", answer)
    assert seen[0]["authorization"] == "Bearer sk-very-secret-123"
    assert '"title":"T","url":"https://t.example/","snippet":"c"' in result.body


def test_a_broken_provider_is_search_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _ = _shaped(tmp_path, monkeypatch, "tavily", {"results": "not a list"})
    assert result.code == "search-failed"
    dead = kit_for(tmp_path, {"provider": "searxng", "url": "http://127.0.0.1:9/"})
    try:
        assert call(Search, dead, query="x").code == "search-failed"
    finally:
        dead.close()
