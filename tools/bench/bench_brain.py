"""The Brain dashboard's figures: server time per page, approval latency, memory added.

1. Server time per page, with 100,000 trail rows and 1,000 policy rows in chalie.db: a real
   daemon in this process (scripted model on loopback); each dashboard page and the REST
   endpoints behind them fetched ``--n`` times by a signed-in client; the figure is the
   server's own ``Server-Timing`` (request in to response out, the client's time left out),
   round trips shown beside it. The trail page is timed at its first page, 1,000 rows deep,
   and at its last page (keyset: every depth costs the same), unfiltered and filtered.
2. An approval visible in an open dashboard: Chromium (Debian's) on the Approvals page; the
   gate asks (PolicyActor.gate, as the dispatcher does) ``--asks`` times; the figure is the
   wall-clock time from the gate publishing the request to the card being in the page's DOM
   (a MutationObserver stamps it), the same clock on both sides.
3. Memory the dashboard adds to the idle daemon: ``chalie run`` (its own process) with
   ``[brain] enabled = true`` and then ``false``, idle RSS after start, and after every page
   was requested three times (404s without the dashboard: serving the first HTTP requests
   grows a server's RSS by itself, so both sides get the same requests), ``--runs`` times.

Floors (the Brain issue): page p50 <= 50 ms; approval visible <= 200 ms; <= 15 MB added.
Run: ``PYTHONPATH=. python tools/bench/bench_brain.py [--n 30] [--asks 20] [--runs 2]``.

Measured on the shared 2-vCPU machine (December 2026, defaults): every page p50 0.5-12.8 ms
(the policy page, 100 of its 1,000 rows, 12.8; the trail page 1.1-1.7 ms at any depth, a
filter that matches nothing, a full scan of 100,000 rows, 11 ms); approval visible p50 14 ms,
max 30 ms; the dashboard's own footprint 5.3 MB RSS (2.5 MB heap), the whole-daemon
comparison +12.8 MB, inside its run-to-run noise of tens of MB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx2

from actors.conversation.chat_bridge import ChatBridge
from actors.gate.policy import PolicyActor
from chalie.calls.trail import Trail
from chalie.gate.policy import PolicyStore
from chalie.gate.tokens import FIRST_TOKEN_FILE
from chalie.process.config import Config
from chalie.wire.events import PermissionRequest
from chalie.wire.messages import TurnContext
from chalie.wire.principals import LOCAL_OWNER
from chalie_app import root as daemon
from chalie_app.root import Runtime

PAGE_FLOOR_MS = 50.0
APPROVAL_FLOOR_MS = 200.0
MEMORY_FLOOR_MB = 15.0
TRAIL_ROWS = 100_000
POLICY_ROWS = 1_000
PAGES = (
    "overview",
    "approvals",
    "policy",
    "mcp_server",
    "remote",
    "trail",
    "conversations",
    "discovery",
)
CHROMIUM = "/usr/bin/chromium"


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * len(values))]


def verdict(figure: float, floor: float) -> str:
    return f"floor {floor:g}  ratio {figure / floor:5.2f}  {'ok' if figure <= floor else 'MISSED'}"


def config_text(model_url: str) -> str:
    return (
        f'[models.default]\nprovider = "openai"\nbase_url = "{model_url}"\nmodel = "scripted"\n'
        '[channels.chat]\nhuman_present = true\npolicy_channel = "chat"\n'
        "[chat]\nport = 0\n[mcp_server]\nport = 0\n"
    )


def start_model(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    script = workdir / "script.json"
    script.write_text(json.dumps({"steps": [{"text": "ok"}]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.fake_llm", str(script)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().rsplit(" ", 1)[-1].strip()
    return proc, url


def fill(home: Path) -> None:
    """100,000 trail rows and 1,000 policy rows, as the daemon would have written them."""
    db = home / "chalie.db"
    Trail(db).close()  # the schema
    conn = sqlite3.connect(db)
    now = time.time() - TRAIL_ROWS
    statuses = ("success", "success", "success", "error", "interrupted")
    tools = ("clock", "calculator", "find_tools", "_mcp_fx_echo", "mcp_manager")
    rows = [
        (
            i,
            f"call-{i}",
            f"turn-{i // 4}",
            f"c_{i // 40:08d}",
            ("chat", "subconscious", "external_agent")[i % 3],
            tools[i % 5],
            tools[i % 5],
            "allow",
            "policy" if i % 7 else "human",
            json.dumps({"i": i, "text": "x" * 40}),
            statuses[i % 5],
            "tool-failed" if i % 5 == 3 else None,
            f"doing thing {i}",
            0,
            now + i,
            now + i + 0.01,
            ("local", "tok-a", "tok-b")[i % 3],
        )
        for i in range(1, TRAIL_ROWS + 1)
    ]
    # Columns named: the table grows columns (healed, parent_call_id, principal...) over time.
    conn.executemany(
        "INSERT INTO trail (id, call_id, turn_id, conversation_id, channel, tool, permission, "
        "decision, decided_by, params, status, code, act_summary, background, started_at, "
        "ended_at, principal) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    conn.commit()
    conn.close()
    store = PolicyStore(db)
    for i in range(POLICY_ROWS):
        store.set(
            ("chat", "subconscious", "external_agent")[i % 3],
            f"tool_{i:04d}.act_{i % 7}",
            ("allow", "ask", "deny")[i % 3],
        )
    store.close()


class Running:
    """A daemon in this process on a filled data directory."""

    def __init__(self, workdir: Path, model_url: str) -> None:
        self.home = workdir / "home"
        self.home.mkdir()
        self.home.chmod(0o700)
        (self.home / "config.toml").write_text(config_text(model_url))
        fill(self.home)
        ready = threading.Event()
        box: dict[str, Runtime] = {}

        def on_ready(rt: Runtime) -> None:
            box["rt"] = rt
            ready.set()

        self.thread = threading.Thread(
            target=daemon.run,
            args=(Config.load(self.home),),
            kwargs={"ready": on_ready},
            daemon=True,
        )
        self.thread.start()
        assert ready.wait(120)
        self.rt = box["rt"]
        chat = self.rt.child("chat", ChatBridge).within(30)
        deadline = time.monotonic() + 60
        while not chat.is_alive():
            assert time.monotonic() < deadline, "chat did not start"
            time.sleep(0.05)
        ws = chat.call(ChatBridge.addresses)["websocket"]
        self.base = ws.replace("ws://", "http://").rsplit("/chat", 1)[0]
        self.token = (self.home / FIRST_TOKEN_FILE).read_text().strip()

    def close(self) -> None:
        self.rt.request_stop()
        self.thread.join(60)


def sign_in(client: httpx2.Client, token: str) -> None:
    form = client.get("/brain/login").text
    nonce = re.search(r'name="nonce" value="([^"]+)"', form)
    assert nonce is not None
    r = client.post("/brain/login", data={"nonce": nonce.group(1), "token": token})
    assert r.status_code == 303, r.text


def timed(client: httpx2.Client, path: str, n: int, **kw: Any) -> tuple[list[float], list[float]]:
    server: list[float] = []
    trip: list[float] = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        r = client.get(path, **kw)
        elapsed = (time.perf_counter() - t0) * 1000
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        if i >= 3:  # warm-up
            server.append(float(r.headers["server-timing"].split("dur=")[1]))
            trip.append(elapsed)
    return server, trip


def bench_pages(run: Running, n: int) -> list[float]:
    print(
        f"\n1. server time per page: {TRAIL_ROWS:,} trail rows, {POLICY_ROWS:,} policy rows, n={n}"
    )
    p50s: list[float] = []
    with (
        httpx2.Client(base_url=run.base, timeout=60) as c,
        httpx2.Client(
            base_url=run.base, timeout=60, headers={"Authorization": f"Bearer {run.token}"}
        ) as api,
    ):
        sign_in(c, run.token)
        first = api.get("/api/v1/trail", params={"limit": 50}).json()
        top = first["rows"][0]["id"]
        targets: list[tuple[str, Any, str]] = [
            (f"/brain/{slug}", c, f"page {slug}") for slug in PAGES
        ]
        targets += [
            (f"/brain/trail?before={top - 1000}", c, "page trail, 1,000 rows deep"),
            ("/brain/trail?before=51", c, "page trail, last page"),
            ("/brain/trail?status=error", c, "page trail, status=error"),
            ("/brain/trail?status=error&before=200", c, "page trail, error, deepest"),
            ("/brain/trail?tool=clock&before=50000", c, "page trail, tool, 50,000 deep"),
            ("/brain/policy?q=tool_09", c, "page policy, searched"),
            ("/brain/policy?page=10", c, "page policy, last rows"),
            ("/brain/trail?tool=nothing", c, "page trail, no match (full scan)"),
            ("/api/v1/trail?before=51", api, "REST trail, last page"),
            ("/api/v1/policy", api, "REST policy (1,000 rows)"),
            ("/api/v1/overview", api, "REST overview"),
        ]
        for path, client, name in targets:
            server, trip = timed(client, path, n)
            p50 = statistics.median(server)
            p50s.append(p50)
            print(
                f"  {name:<34} server p50 {p50:6.2f} ms  p90 {p90(server):6.2f}"
                f"  (round trip p50 {statistics.median(trip):6.2f})  {verdict(p50, PAGE_FLOOR_MS)}"
            )
    return p50s


def bench_approvals(run: Running, asks: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    print(f"\n2. an approval visible in an open dashboard (Chromium), asks={asks}")
    published: dict[str, float] = {}

    def on_event(event: Any) -> None:
        if isinstance(event, PermissionRequest):
            published[event.request_id] = time.time() * 1000

    run.rt.events.subscribe(None, on_event)
    policy = run.rt.child("policy", PolicyActor).within(10)
    out: list[float] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
        )
        context = browser.new_context()
        page = context.new_page()
        page.goto(run.base + "/brain/login")
        page.fill("#token", run.token)
        page.click("button[type=submit]")
        page.wait_for_url("**/brain/overview")
        page.goto(run.base + "/brain/approvals")
        page.evaluate(
            """() => { window.seen = {};
            new MutationObserver(() => {
              document.querySelectorAll('article.approval').forEach(a => {
                const id = a.getAttribute('aria-labelledby').slice(4);
                if (!(id in window.seen)) window.seen[id] = Date.now();
              });
            }).observe(document.body, {subtree: true, childList: true}); }"""
        )
        page.wait_for_timeout(500)  # the event stream is open
        for i in range(asks + 2):
            before = set(published)
            ctx = TurnContext(
                conversation_id=f"c_bench{i}", turn_id=f"t{i}", channel="chat", scope="unrestricted"
            )
            reply: Future[Any] = policy.call(
                PolicyActor.gate, f"call{i}", ctx, "clock", "clock.now", False, "bench", {"z": 1}
            )
            deadline = time.monotonic() + 10
            while not set(published) - before:
                assert time.monotonic() < deadline, "the gate did not ask"
                time.sleep(0.001)
            (rid,) = set(published) - before
            page.wait_for_function("id => id in window.seen", arg=rid, timeout=10_000)
            seen: dict[str, float] = page.evaluate("() => window.seen")
            if i >= 2:  # warm-up
                out.append(seen[rid] - published[rid])
            policy.call(PolicyActor.answer, rid, "deny", LOCAL_OWNER)
            reply.result(10)
            page.wait_for_selector("article.approval", state="detached", timeout=10_000)
        browser.close()
    p50 = statistics.median(out)
    print(
        f"  gate asks -> card in the DOM  p50 {p50:6.1f} ms  max {max(out):6.1f} ms  n={len(out)}  "
        f"{verdict(p50, APPROVAL_FLOOR_MS)}"
    )
    return out


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def one_daemon(workdir: Path, model_url: str, enabled: bool, settle: float) -> tuple[float, float]:
    home = Path(tempfile.mkdtemp(prefix="bb-", dir=workdir))
    home.chmod(0o700)
    (home / "config.toml").write_text(
        config_text(model_url) + f"[brain]\nenabled = {'true' if enabled else 'false'}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(home), "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        base = None
        deadline = time.monotonic() + 120
        assert proc.stderr is not None
        while base is None:
            assert time.monotonic() < deadline and proc.poll() is None, "the daemon did not start"
            text = proc.stderr.readline()
            m = re.search(r'"port": ?(\d+)', text) if "chat WebSocket listening" in text else None
            if m:
                base = f"http://127.0.0.1:{m.group(1)}"
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
        time.sleep(settle)
        idle = rss_kb(proc.pid) / 1024
        # The same requests either way (404s without the dashboard): the first requests a
        # server answers grow its RSS by themselves (~50 MB here: malloc arenas, buffers).
        token = (home / FIRST_TOKEN_FILE).read_text().strip()
        with httpx2.Client(base_url=base, timeout=60) as c:
            if enabled:
                sign_in(c, token)
            for _ in range(3):
                for slug in PAGES:
                    r = c.get(f"/brain/{slug}")
                    assert r.status_code == (200 if enabled else 404), (slug, r.status_code)
        time.sleep(settle)
        return idle, rss_kb(proc.pid) / 1024
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(home, ignore_errors=True)


FOOTPRINT = """
import tracemalloc
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 1048576
import chalie_app.brain_backend, chalie.process.config, chalie.gate.tokens, msgspec
import starlette.applications, uvicorn
before = rss()
tracemalloc.start()
import jinja2, chalie.brain.pages, chalie.brain.web
from chalie.brain.access import DashboardSessions
from chalie.brain.openapi import document
brain = chalie.brain.web.Brain(
    None, DashboardSessions(), lambda s: None, lambda h: False,
    hosts=frozenset(), origins=frozenset(),
)
for name in brain.templates.list_templates():
    brain.templates.get_template(name)
brain.routes()
document()
heap, _peak = tracemalloc.get_traced_memory()
print(heap / 1048576, rss() - before)
"""


def bench_footprint() -> float:
    """What the dashboard itself holds: its modules, Jinja2, compiled templates, the document."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", FOOTPRINT], capture_output=True, text=True, env=env, check=True
    )
    heap, rss = (float(x) for x in out.stdout.split())
    print(
        f"  the dashboard's code, compiled templates and API document (fresh process): "
        f"{heap:4.1f} MB Python heap, {rss:4.1f} MB RSS  {verdict(rss, MEMORY_FLOOR_MB)}"
    )
    return rss


def bench_memory(workdir: Path, model_url: str, runs: int, settle: float) -> float:
    print(f"\n3. idle RSS of `chalie run` with and without the dashboard, runs={runs}")
    on: list[float] = []
    off: list[float] = []
    for _ in range(runs):
        idle_on, used_on = one_daemon(workdir, model_url, True, settle)
        idle_off, used_off = one_daemon(workdir, model_url, False, settle)
        on.append(used_on)
        off.append(used_off)
        print(
            f"  brain on:  {idle_on:6.1f} MB idle, {used_on:6.1f} MB after every page 3 times\n"
            f"  brain off: {idle_off:6.1f} MB idle, {used_off:6.1f} MB, the same requests (404s)"
        )
    added = statistics.median(on) - statistics.median(off)
    print(
        f"  added by the dashboard (median on - median off, after the requests)  {added:5.1f} MB  "
        f"{verdict(added, MEMORY_FLOOR_MB)}  (whole-daemon RSS varies by tens of MB run to run)"
    )
    bench_footprint()
    return added


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--asks", type=int, default=20)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--only", choices=("pages", "approvals", "memory"), action="append")
    args = ap.parse_args()
    parts = set(args.only or ("pages", "approvals", "memory"))
    workdir = Path(tempfile.mkdtemp(prefix="bench-brain-", dir="/tmp"))
    model, url = start_model(workdir)
    try:
        if parts & {"pages", "approvals"}:
            run = Running(workdir, url)
            try:
                if "pages" in parts:
                    bench_pages(run, args.n)
                if "approvals" in parts:
                    bench_approvals(run, args.asks)
            finally:
                run.close()
        if "memory" in parts:
            bench_memory(workdir, url, args.runs, args.settle)
    finally:
        model.terminate()
        model.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
