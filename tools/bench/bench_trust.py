"""Issue 30's figures: what one caller can hold or spend, each beside its floor and the ratio.

1. The slow-header flood: 20 ``web_fetch`` calls to a server that trickles its response
   headers a byte every 0.2 s, all at once through a real dispatcher (its inline executor
   and web_fetch's lane, the guarded fetcher, [web] fetch_timeout at its default 20 s),
   then one fetch of an instant page on another site. Target: the instant page in under
   1 s while the 20 run. Floor: the same instant fetch with nothing else running. Also
   shown: how the 20 ended (each by its deadline or refused at once, none past
   fetch_timeout plus a second).

2. The disk quota: one agent token floods the real daemon's inbound MCP server with
   ``talk_to_chalie`` calls of 32,000 characters (the probe's), each a new conversation
   and a scripted model's answer, until it is refused. Target: refused with
   ``quota-exceeded``, the token's stored bytes at most ``conversations.agent_max_bytes``
   (8 MiB here; 64 MiB by default) and the database grown by no more than that bound plus
   a page's slack. Floor: the bound itself (ratio: stored / bound).

3. The slow gallery: one browser page (real Chromium) with 24 images whose headers 6 sites
   trickle (4 each, the per-site cap), [web] fetch_timeout 20 s and the action's 15 s,
   while another page opens an instant article. Target: the other page opens in under
   3 s (one page's slow sites hold none of another's requests). Floor: the same open with
   nothing else running. Also shown: how long the gallery's requests outlive its timed-out
   action (target under 2 s, not the fetch deadline).

Run: ``python tools/bench/bench_trust.py [--only flood|quota|gallery]``
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chalie.process.config import Config
from chalie.web.kit import WebKit
from tools.bench.bench_web import article, met, serve, tool_call
from tools.http_servers import TrickleServer


def bench_flood(home: Path, trickling: int = 20) -> None:
    from actors.calls.dispatcher import DispatcherActor, submit
    from actors.gate.policy import PolicyActor
    from chalie.calls.envelope import parse
    from chalie.calls.registry import Registry
    from chalie.services import Services
    from chalie.wire.bus import EventBus

    httpd, port = serve({"/small": article(8 * 1024)})
    trickle = TrickleServer(every=0.2)
    allow = [f"127.0.0.1:{port}", f"127.0.0.1:{trickle.port}"]
    config = Config.from_mapping({"web": {"allow": allow}}, home=home)
    kit = WebKit(config.web, home=home)
    bus = EventBus()
    policy = PolicyActor.start(home / "chalie.db", bus)
    dispatcher = DispatcherActor.start(
        Registry.collect(), Services(web=kit), home / "chalie.db", policy, None, bus
    )

    def fetch(url: str, n: int) -> Any:
        call = tool_call("web_fetch", {"url": url}, n, "subconscious")
        return submit(dispatcher, call)

    def instant(n: int) -> float:
        began = time.perf_counter()
        outcome = fetch(f"http://127.0.0.1:{port}/small", n).result(120)
        assert outcome.status == "success", outcome.envelope
        return (time.perf_counter() - began) * 1000

    limit = config.web.fetch_timeout
    try:
        for i in range(5):
            instant(-1 - i)  # warm: the connection, the lane's threads
        floor = min(instant(-10 - i) for i in range(5))
        print(
            f"1. slow-header flood: {trickling} web_fetch calls trickled a header byte every "
            f"0.2 s ([web] fetch_timeout {limit:g} s), then one instant page elsewhere:"
        )
        began = time.monotonic()
        flood: list[tuple[float, concurrent.futures.Future[Any]]] = []
        for n in range(trickling):
            flood.append((time.monotonic(), fetch(trickle.url(f"/p{n}"), n)))
        deadline = time.monotonic() + 10
        while trickle.accepted < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the flood is running: its fetches hold their sockets
        figure = instant(1000)
        codes: collections.Counter[str] = collections.Counter()
        longest = 0.0
        for started, fut in flood:
            outcome = fut.result(limit * 3 + 30)
            longest = max(longest, time.monotonic() - started)
            (env,) = parse(outcome.envelope)
            codes[str(env.attrs.get("code", outcome.status))] += 1
        ratio = figure / floor if floor > 0 else float("inf")
        print(
            f"  => instant page during the flood: {figure:.2f} ms, floor (the same page with "
            f"nothing else running) {floor:.2f} ms, ratio {ratio:.1f}; "
            f"target < 1000 ms: {met(figure < 1000)}"
        )
        shown = ", ".join(f"{n} {code}" for code, n in sorted(codes.items()))
        print(
            f"  => the {trickling} trickled fetches ended: {shown}; the longest took "
            f"{longest:.1f} s (fetch_timeout {limit:g} s): {met(longest <= limit + 1)}; "
            f"all done {time.monotonic() - began:.1f} s after the flood began"
        )
    finally:
        dispatcher.stop()
        policy.stop()
        kit.close()
        trickle.close()
        httpd.shutdown()


def bench_quota(home: Path, bound: int = 8 * 1024 * 1024, limit: int = 2000) -> None:
    from actors.mcp.server import McpServerActor
    from chalie.conversation.store import ConversationStore
    from chalie.gate.tokens import TokenStore
    from tools.agent_flood import code_of, flood
    from tools.daemon_thread import DaemonThread
    from tools.fake_llm.script import Script, Step
    from tools.fake_llm.server import FakeModelServer
    from tools.waiting import wait_until

    model = FakeModelServer(Script(steps=[], on_user=Step(text="ok"))).start()
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    (home / "config.toml").write_text(
        "workers = 1\n[mcp_server]\nport = 0\nrequests_per_minute = 1000000\n"
        f"[conversations]\nagent_max_bytes = {bound}\n"
        "[background]\nreflection = false\n"
        "[models.default]\n"
        f'provider = "openai"\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
        "stream = true\nretries = 0\n"
    )
    daemon = DaemonThread(Config.load(home))
    try:
        rt = daemon.rt
        server = rt.child("mcp_server", McpServerActor).within(10)
        wait_until(server.is_alive, 60, "the MCP server to start")
        url = str(wait_until(lambda: server.call(McpServerActor.status).get("url"), 60, "MCP"))
        with TokenStore(rt.db_path) as tokens:
            secret = tokens.create("flooder")
            (token,) = [t for t in tokens.list() if t.name == "flooder"]
        db_before = rt.db_path.stat().st_size
        text = "flood " * 5_333

        began = time.monotonic()
        results = flood(url, secret, text, limit)
        took = time.monotonic() - began
        last = results[-1]
        accepted = len(results) - 1 if last.is_error else len(results)
        code = str(code_of(last)) if last.is_error else "none"
        said = last.content[0].text if last.is_error and last.content else ""
        store = ConversationStore(rt.db_path)
        try:
            conversations, stored = store.usage(token.id)
        finally:
            store.close()
        grown = rt.db_path.stat().st_size - db_before
        print(
            f"2. disk quota: one agent token sent talk_to_chalie calls of {len(text):,} "
            f"characters until refused (conversations.agent_max_bytes {bound:,}):"
        )
        print(f"     {accepted} calls accepted in {took:.1f} s, then refused: {said[:200]}")
        ratio = stored / bound
        print(
            f"  => the token's stored bytes: {stored:,} in {conversations} conversations, floor "
            f"(the bound) {bound:,}, ratio {ratio:.2f}; target refused with quota-exceeded and "
            f"stored <= bound: {met(code == 'quota-exceeded' and stored <= bound)}"
        )
        print(
            f"  => chalie.db grew {grown:,} bytes over the flood ({grown / max(1, accepted):,.0f} "
            f"a call): {met(grown <= bound * 1.25)} (bound plus 25 % for SQLite's pages)"
        )
    finally:
        daemon.stop()
        model.stop()


def bench_gallery(home: Path, sites: int = 6, each: int = 4) -> None:
    import threading

    trickles = [TrickleServer(every=0.2) for _ in range(sites)]
    images = "".join(
        f"<img src='http://127.0.0.1:{t.port}/i{i}.png'>" for t in trickles for i in range(each)
    )
    gallery = f"<html><head><title>Gallery</title></head><body>{images}</body></html>"
    httpd, port = serve({"/gallery": gallery.encode(), "/small": article(8 * 1024)})
    allow = [f"127.0.0.1:{port}", *(f"127.0.0.1:{t.port}" for t in trickles)]
    config = Config.from_mapping(
        {"web": {"allow": allow, "browser": {"max_sessions": 4}}}, home=home
    )
    kit = WebKit(config.web, home=home)
    pool = kit.browser
    action = config.web.browser.action_timeout

    def trickling() -> int:
        return sum(t.open for t in trickles)

    def open_small(session: str) -> float:
        began = time.perf_counter()
        pool.act(session, "open", url=f"http://127.0.0.1:{port}/small")
        return (time.perf_counter() - began) * 1000

    try:
        open_small("warm")  # the browser starts
        floor = min(open_small(f"floor{i}") for i in range(3))
        for i in range(3):
            pool.close_session(f"floor{i}")
        print(
            f"3. slow gallery: one browser page with {sites * each} images trickled from "
            f"{sites} sites ([web] fetch_timeout {config.web.fetch_timeout:g} s, action "
            f"{action:g} s), and another page opened meanwhile:"
        )
        ended: list[float] = []

        def slow() -> None:
            try:
                pool.act("gallery", "open", url=f"http://127.0.0.1:{port}/gallery")
            except Exception:
                pass  # tool-timeout: what it is for
            ended.append(time.monotonic())

        thread = threading.Thread(target=slow, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while trickling() < 4 and time.monotonic() < deadline:  # the gallery is loading
            time.sleep(0.01)
        assert not ended, "the gallery's action ended before the other page was opened"
        began = time.perf_counter()
        try:
            figure, failed = open_small("other"), ""
        except Exception as exc:  # the browser's tool-timeout: the other page was starved
            figure = (time.perf_counter() - began) * 1000
            failed = f" (failed: {getattr(exc, 'code', type(exc).__name__)})"
        ratio = figure / floor if floor > 0 else float("inf")
        print(
            f"  => the other page's open during the gallery: {figure:.0f} ms{failed}, floor "
            f"(the same open with nothing else running) {floor:.0f} ms, ratio {ratio:.1f}; "
            f"target < 3000 ms: {met(figure < 3000 and not failed)}"
        )
        thread.join(action + 30)
        while trickling() and time.monotonic() < ended[0] + 60:
            time.sleep(0.01)
        after = time.monotonic() - ended[0]
        print(
            f"  => the gallery's requests ended {after:.2f} s after its action timed out "
            f"(fetch_timeout {config.web.fetch_timeout:g} s): target < 2 s: {met(after < 2)}"
        )
    finally:
        kit.close()
        for t in trickles:
            t.close()
        httpd.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=("flood", "quota", "gallery"))
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="chalie-bench-trust-"))
    if args.only in (None, "flood"):
        bench_flood(home / "flood")
    if args.only in (None, "quota"):
        bench_quota(home / "quota")
    if args.only in (None, "gallery"):
        bench_gallery(home / "gallery")
    print(f"load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
