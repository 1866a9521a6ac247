"""A bounded pool of headless Chromium pages (Playwright), closed when idle, under the SSRF guard.

Nothing starts until the first ``browser`` call: then a thread with its own
event loop starts Playwright and launches Chromium (Debian's
``/usr/bin/chromium`` by ``executable_path``: nothing is downloaded). Each
delegate turn gets its own page in its own browser context (no cookies or
storage shared between turns), kept :attr:`BrowserConfig.session_idle`
seconds after its last action; at most ``max_sessions`` are open. When no
page has been open for ``idle_close`` seconds the browser, Playwright and the
thread are stopped, so an idle daemon holds no browser at all.

The guard, on every request the page makes (navigation, sub-resource, XHR,
form post, redirect): the context routes ``**/*`` to :meth:`_route`, which
makes the request itself with the guarded fetcher (chalie.web.http) and
fulfils the page's request with the answer. Each page makes its requests on its
own executor of ``page_fetches`` threads (one page's slow sites never hold
another page's requests), and the requests it has in flight or waiting are
cancelled when its action times out or its page closes (:meth:`_Session.cancel`),
instead of running on to the fetch deadline. Chromium therefore never opens a
connection of its own; to make sure of it, its resolver is told that no name
exists (``--host-resolver-rules``), WebSockets are answered by a handler that
closes them, service workers are blocked, and WebRTC does not exist: the
IP-handling flag alone still let a page send STUN over UDP to any address, so
every frame's document starts with its interfaces removed (:data:`NO_WEBRTC`,
a context init script, run before any of the page's own scripts, in frames
the page makes too). A request the guard refuses is aborted and reported in
the action's result.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from chalie.process.config import BrowserConfig
from chalie.web.extract import Document, html_document
from chalie.web.http import Fetcher, FetchError

log = logging.getLogger("chalie.browser")

# How Debian's Chromium runs headless here (as root, in a container, no GPU, quiet):
# also what the dashboard's browser tests and the benchmarks launch it with.
HEADLESS_ARGS: Final = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
)
# The browser tool's: no extensions, no name resolution of its own (every request goes
# through our SSRF-guarded fetcher), no WebRTC around it.
LAUNCH_ARGS: Final = (
    *HEADLESS_ARGS,
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)
# Run in every frame before its scripts: no WebRTC (its UDP would bypass the routing).
NO_WEBRTC: Final = """(() => {
  for (const name of Object.getOwnPropertyNames(globalThis)) {
    if (/^(webkit)?RTC/.test(name)) {
      try { delete globalThis[name]; } catch (e) {}
    }
  }
  const media = globalThis.navigator && navigator.mediaDevices;
  if (media) {
    try { delete Object.getPrototypeOf(navigator).mediaDevices; } catch (e) {}
  }
})();"""
# Request headers the page's request keeps when we make it for the page.
FORWARDED: Final = frozenset(
    {"accept", "accept-language", "content-type", "referer", "user-agent", "cookie", "origin"}
)
# Response headers not handed back: the body is already decoded and whole.
DROPPED: Final = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"}
)
Action = Literal["open", "click", "type", "scroll", "extract", "screenshot", "close"]
ACTIONS: Final[tuple[str, ...]] = (
    "open",
    "click",
    "type",
    "scroll",
    "extract",
    "screenshot",
    "close",
)


class BrowserError(Exception):
    def __init__(self, code: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


@dataclass
class PageState:
    """What one action left: where the page is, its document, a screenshot, refused requests."""

    url: str
    title: str
    document: Document | None = None
    screenshot: bytes | None = None
    blocked: list[str] = field(default_factory=list)


@dataclass
class _Session:
    context: Any
    page: Any
    used: float
    executor: concurrent.futures.ThreadPoolExecutor
    blocked: list[str] = field(default_factory=list)
    busy: int = 0
    # Set to cancel the requests made so far (a request takes the one current as it starts).
    stop: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """End every request this page has in flight or waiting; later ones go on."""
        self.stop.set()
        self.stop = threading.Event()

    def close(self) -> None:
        self.stop.set()
        self.executor.shutdown(wait=False, cancel_futures=True)


class BrowserPool:
    """Shared by every ``browser`` call of the daemon; thread-safe; starts nothing until used."""

    def __init__(self, config: BrowserConfig, fetcher: Fetcher) -> None:
        self.config = config
        self.fetcher = fetcher
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._playwright: Any = None
        self._browser: Any = None
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._idle_since = time.monotonic()
        self._reaper: asyncio.TimerHandle | None = None
        self._opening = 0
        self.launches = 0  # how many times a browser process was started (tests, bench)

    # -- the public face (any thread) ---------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether a browser process is up now."""
        return self._browser is not None

    def sessions(self) -> int:
        return len(self._sessions)

    def act(
        self,
        session_id: str,
        action: Action,
        *,
        url: str | None = None,
        selector: str | None = None,
        text: str | None = None,
        submit: bool = False,
        amount: int = 1,
        timeout: float | None = None,
    ) -> PageState:
        """Run one action on the session's page (opened on first use); raises BrowserError."""
        limit = timeout or self.config.action_timeout
        for attempt in range(2):
            coro = self._act(session_id, action, url, selector, text, submit, amount, limit)
            try:
                return self._call(coro, limit + 10)
            except concurrent.futures.CancelledError:
                # The browser was closing as this action arrived: once more, on a new one.
                if attempt:
                    break
        raise BrowserError("browser-unavailable", "the browser closed during the action")

    def close_session(self, session_id: str) -> None:
        loop = self._loop
        if loop is not None and session_id in self._sessions:
            with contextlib.suppress(Exception):
                self._call(self._close_session(session_id), 10)

    def close(self) -> None:
        """Stop the browser and the thread now (daemon stop)."""
        with self._lock:
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(20)
        thread.join(20)

    # -- the loop thread ----------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, PageState], wait: float) -> PageState:
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(wait)
        except TimeoutError:
            future.cancel()
            raise BrowserError(
                "tool-timeout", f"the browser did not answer in {wait:g} s"
            ) from None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                return self._loop
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                try:
                    loop.run_forever()
                finally:
                    loop.close()

            thread = threading.Thread(target=run, name="chalie-browser", daemon=True)
            thread.start()
            started.wait(10)
            self._loop, self._thread = loop, thread
            return loop

    async def _start_browser(self) -> Any:
        if self._browser is not None:
            return self._browser
        try:
            from playwright.async_api import async_playwright
        except ImportError:
            raise BrowserError(
                "browser-unavailable",
                "Playwright is not installed",
                "The operator must install chalie[browser] (and Debian's chromium).",
            ) from None
        executable = self.config.executable
        if not executable.exists():
            raise BrowserError(
                "browser-unavailable",
                f"no Chromium at {executable}",
                "The operator must install chromium (apt-get install chromium) or set "
                "web.browser.executable.",
            )
        playwright = await async_playwright().start()
        try:
            browser = await playwright.chromium.launch(
                executable_path=str(executable), headless=True, args=list(LAUNCH_ARGS)
            )
        except Exception as exc:
            await playwright.stop()
            raise BrowserError(
                "browser-unavailable", f"Chromium did not start: {str(exc).splitlines()[0][:200]}"
            ) from None
        self._playwright, self._browser = playwright, browser
        self._idle_since = time.monotonic()
        self.launches += 1
        self._schedule_reap()
        return browser

    async def _session(self, session_id: str) -> _Session:
        found = self._sessions.get(session_id)
        if found is not None:
            self._sessions.move_to_end(session_id)
            return found
        if len(self._sessions) >= self.config.max_sessions:
            idle = next((k for k, s in self._sessions.items() if s.busy == 0), None)
            if idle is None:
                raise BrowserError(
                    "browser-unavailable",
                    f"all {self.config.max_sessions} browser pages are in use",
                    "Try again in a moment.",
                )
            await self._close_session(idle)
        self._opening += 1  # the reaper leaves a browser alone while a page is being opened
        try:
            browser = await self._start_browser()
            context = await browser.new_context(
                service_workers="block", java_script_enabled=True, accept_downloads=False
            )
            await context.add_init_script(NO_WEBRTC)
            session = _Session(
                context,
                None,
                time.monotonic(),
                concurrent.futures.ThreadPoolExecutor(
                    self.config.page_fetches, thread_name_prefix="chalie-page"
                ),
            )
            await context.route("**/*", lambda route: self._route(route, session))
            await context.route_web_socket("**/*", _refuse_websocket)
            context.set_default_timeout(self.config.action_timeout * 1000)
            session.page = await context.new_page()
        finally:
            self._opening -= 1
        self._sessions[session_id] = session
        return session

    async def _route(self, route: Any, session: _Session) -> None:
        request = route.request
        url = request.url
        if not url.startswith(("http://", "https://")):
            await route.abort("blockedbyclient")
            return
        headers = {k: v for k, v in (await request.all_headers()).items() if k in FORWARDED}
        body = request.post_data_buffer
        fetcher, stop = self.fetcher, session.stop
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
                session.executor,
                lambda: fetcher.request(
                    request.method, url, headers=headers, content=body, cancelled=stop
                ),
            )
        except (RuntimeError, asyncio.CancelledError):  # the page closed: nobody waits for it
            with contextlib.suppress(Exception):
                await route.abort("failed")
            return
        except FetchError as exc:
            if exc.code == "blocked-address":
                session.blocked.append(url[:300])
            with contextlib.suppress(Exception):
                await route.abort("blockedbyclient" if exc.code == "blocked-address" else "failed")
            return
        kept = {k: v for k, v in answer.headers.items() if k not in DROPPED}
        with contextlib.suppress(Exception):
            await route.fulfill(status=answer.status, headers=kept, body=answer.body)

    async def _act(
        self,
        session_id: str,
        action: Action,
        url: str | None,
        selector: str | None,
        text: str | None,
        submit: bool,
        amount: int,
        limit: float,
    ) -> PageState:
        if action == "close":
            await self._close_session(session_id)
            return PageState(url="", title="")
        if action != "open" and session_id not in self._sessions:
            raise BrowserError(
                "browser-error", "no page is open", "Call browser with action=open first."
            )
        session = await self._session(session_id)
        session.busy += 1
        session.used = time.monotonic()
        page = session.page
        before = len(session.blocked)
        try:
            async with asyncio.timeout(limit):
                await self._do(page, action, url, selector, text, submit, amount, limit)
                state = PageState(url=page.url, title=await page.title())
                if action == "screenshot":
                    state.screenshot = await page.screenshot(type="png", full_page=False)
                else:
                    state.document = html_document(await page.content(), page.url)
        except BrowserError:
            raise
        except asyncio.CancelledError:  # the caller gave up waiting: so does the page
            session.cancel()
            raise
        except Exception as exc:  # Playwright's errors: a selector, a navigation, a crash
            if not _timed_out(exc):
                raise BrowserError("browser-error", _playwright_reason(exc)) from None
            session.cancel()  # ours or Playwright's own (goto's, a click's): the same end
            raise BrowserError(
                "tool-timeout", f"the page did not finish {action} within {limit:g} s"
            ) from None
        finally:
            session.busy -= 1
            session.used = time.monotonic()
        state.blocked = session.blocked[before:]
        return state

    async def _do(
        self,
        page: Any,
        action: Action,
        url: str | None,
        selector: str | None,
        text: str | None,
        submit: bool,
        amount: int,
        limit: float,
    ) -> None:
        ms = limit * 1000
        if action == "open":
            if not url:
                raise BrowserError("missing-params", "open needs a url")
            try:  # the name is resolved off the loop: other pages keep going meanwhile
                await asyncio.get_running_loop().run_in_executor(
                    None, self.fetcher.guard.check, url
                )
            except Exception as exc:
                code = getattr(exc, "code", "fetch-failed")
                raise BrowserError(
                    code if isinstance(code, str) else "fetch-failed",
                    getattr(exc, "reason", str(exc)),
                    "Only public web addresses can be opened.",
                ) from None
            await page.goto(url, wait_until="load", timeout=ms)
        elif action == "click":
            if not selector:
                raise BrowserError("missing-params", "click needs a selector")
            await _locator(page, selector).click(timeout=ms)
        elif action == "type":
            if not selector or text is None:
                raise BrowserError("missing-params", "type needs a selector and text")
            target = _locator(page, selector)
            await target.fill(text, timeout=ms)
            if submit:
                await target.press("Enter", timeout=ms)
        elif action == "scroll":
            await page.mouse.wheel(0, 800 * max(-20, min(20, amount)))
        await _settle(page)

    # -- idle handling (on the loop) ----------------------------------------------------
    def _schedule_reap(self) -> None:
        loop = self._loop
        if loop is None:
            return
        period = max(0.05, min(self.config.session_idle, self.config.idle_close) / 4)
        self._reaper = loop.call_later(period, lambda: asyncio.ensure_future(self._reap()))

    async def _reap(self) -> None:
        now = time.monotonic()
        for sid, session in list(self._sessions.items()):
            if session.busy == 0 and now - session.used > self.config.session_idle:
                await self._close_session(sid)
        if self._sessions or self._opening:
            self._idle_since = now
        elif now - self._idle_since >= self.config.idle_close:
            await self._shutdown()
            return
        self._schedule_reap()

    async def _close_session(self, session_id: str) -> PageState:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.close()
            with contextlib.suppress(Exception):
                await session.context.close()
        if not self._sessions:
            self._idle_since = time.monotonic()
        return PageState(url="", title="")

    async def _shutdown(self) -> None:
        # Detached first: an action arriving from now on starts a new loop and browser.
        with self._lock:
            loop = self._loop
            self._loop = self._thread = None
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for sid in list(self._sessions):
            await self._close_session(sid)
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        if browser is not None:
            with contextlib.suppress(Exception):
                await browser.close()
        if playwright is not None:
            with contextlib.suppress(Exception):
                await playwright.stop()
        # An action that reached this loop meanwhile is cancelled (act() retries it).
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        if loop is not None:
            loop.call_soon(loop.stop)


def _locator(page: Any, selector: str) -> Any:
    """A CSS selector, or ``text=...`` / a link's or button's visible words."""
    if selector.startswith(("text=", "css=", "xpath=", "role=", "#", ".", "[", "//")):
        return page.locator(selector).first
    if any(c in selector for c in "#.[]>:="):
        return page.locator(selector).first
    return page.get_by_text(selector, exact=False).first


async def _settle(page: Any) -> None:
    """Let the page finish what the action started (short: a busy page is read as it is)."""
    with contextlib.suppress(Exception):
        await page.wait_for_load_state("load", timeout=5000)
    with contextlib.suppress(Exception):
        await page.wait_for_load_state("networkidle", timeout=1500)


async def _refuse_websocket(ws: Any) -> None:
    with contextlib.suppress(Exception):
        await ws.close(code=1008, reason="WebSockets are not allowed")


def _timed_out(exc: BaseException) -> bool:
    """asyncio's timeout, or Playwright's TimeoutError (its own class, not a builtin's)."""
    return any(c.__name__ == "TimeoutError" for c in type(exc).__mro__)


def _playwright_reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    if "ERR_BLOCKED_BY_CLIENT" in first:
        return "the page was refused by the SSRF guard"
    return first[:300]


def png_payload(png: bytes) -> dict[str, Any]:
    """A screenshot as the rich payload the chat client shows."""
    return {
        "items": [
            {"type": "image", "mime_type": "image/png", "data": base64.b64encode(png).decode()}
        ]
    }
