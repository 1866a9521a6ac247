"""The web tools' shared parts, made once per daemon: the guard, the fetcher, search, the browser.

The composition root builds one :class:`WebKit` from ``[web]`` and hands it
to abilities as ``services.web``. Each part is made on first use
(the browser pool starts no browser until a ``browser`` call), and
:meth:`close` releases them at daemon stop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from chalie.net.ssrf import Guard, Resolver
from chalie.process.config import WebConfig
from chalie.web.browser import BrowserPool
from chalie.web.http import Fetcher, Limits
from chalie.web.search import Searcher, key_reader


class WebKit:
    def __init__(
        self,
        config: WebConfig,
        *,
        home: Path | None = None,
        secrets: Callable[[str], str | None] | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.config = config
        self.home = home
        self.guard = Guard.from_config(config.allow, resolver)
        self._secrets = secrets or _secret_file(home)
        self._lock = threading.Lock()
        self._fetcher: Fetcher | None = None
        self._searcher: Searcher | None = None
        self._browser: BrowserPool | None = None

    @property
    def fetcher(self) -> Fetcher:
        with self._lock:
            if self._fetcher is None:
                cfg = self.config
                limits = Limits(cfg.fetch_timeout, cfg.max_bytes, cfg.max_redirects)
                self._fetcher = Fetcher(self.guard, limits, cfg.user_agent)
            return self._fetcher

    @property
    def searcher(self) -> Searcher:
        with self._lock:
            if self._searcher is None:
                cfg = self.config
                key = key_reader(cfg.search, self._secrets)
                self._searcher = Searcher(cfg.search, key, user_agent=cfg.user_agent)
            return self._searcher

    @property
    def browser(self) -> BrowserPool:
        fetcher = self.fetcher
        with self._lock:
            if self._browser is None:
                self._browser = BrowserPool(self.config.browser, fetcher)
            return self._browser

    def end_session(self, turn_id: str) -> None:
        """A delegate turn ended: close its browser page, if it opened one."""
        pool = self._browser
        if pool is not None:
            pool.close_session(turn_id)

    @property
    def browser_running(self) -> bool:
        return self._browser is not None and self._browser.running

    def close(self) -> None:
        with self._lock:
            parts = (self._browser, self._searcher, self._fetcher)
            self._browser = self._searcher = self._fetcher = None
        for part in parts:
            if part is not None:
                part.close()


def _secret_file(home: Path | None) -> Callable[[str], str | None]:
    if home is None:
        return lambda _name: None
    from chalie.mcp.secrets import MissingSecret, SecretFile

    store = SecretFile(home)

    def read(name: str) -> str | None:
        try:
            return store.get(name)
        except MissingSecret:
            return None

    return read
