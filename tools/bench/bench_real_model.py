"""A real small model driving Chalie: right answers, right through the tool, calls, tokens, time.

Every prompt of :data:`PROMPTS` (everyday requests across the built-in abilities,
plus chit-chat that needs no tool) runs as a new conversation through a real
daemon, by ``chalie chat`` (the chat channel, piped) or ``chalie ask`` (a turn
without a human), against a real model served by llama.cpp
(``python -m tools.real_model setup`` once; this script starts the server).
The world the prompts ask about is real too: Radicale (calendar, contacts),
Dovecot with aiosmtpd (mail), and a loopback HTTP server answering as
Open-Meteo, SearXNG and a small web site (tools/bench/real_model_world.py).

A recording proxy between the daemon and the model server keeps every request's
prompt tokens, the tokens the server took from its prompt cache, and what the
model wrote (``--transcripts FILE`` writes them as JSON lines).

Per prompt and in total it prints: answered right (the answer holds the fact
asked for, with no markup and no described call), right through the tool (and
the expected tool succeeded in the turn), calls made and failed, answers that
were markup or a described call, first-request prompt tokens, the prompt-cache
hit rate, and seconds per turn. Floors: 70 % right, 60 % of tool-needing
prompts right through the tool, first request <= 450 prompt tokens.

``--code DIR`` runs the daemon from another checkout (the figures before a
change, in the same run: prompts, world and judge stay this checkout's).

Run: ``python tools/bench/bench_real_model.py [--runs 3] [--via chat|ask]
[--model 1.5b|0.5b] [--only ID,ID] [--code DIR]``. It is a benchmark, not a
test: one run of 43 prompts takes 10-20 minutes on two cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from zoneinfo import ZoneInfo

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

try:
    from chalie.providers.signatures import listed
except ImportError:  # --code: a checkout from before the compact listing

    def listed(system: str) -> list[str]:
        return []


from tools import real_model  # noqa: E402
from tools.bench import other_code  # noqa: E402
from tools.bench import real_model_world as rw  # noqa: E402

RIGHT_FLOOR: Final = 0.70
TOOL_FLOOR: Final = 0.60
TOKEN_FLOOR: Final = 450


# -- the prompts ------------------------------------------------------------------------

WORLD_TOOLS: Final = frozenset(
    {"weather", "calendar", "contacts", "email", "memory", "web_search", "web_browse"}
)


Expect = Callable[["Run"], str]  # the regex a right answer matches, made when it runs


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str  # "{site}" stands for the fixture web site's URL
    tool: str | None  # the tool a right answer comes through; None: no tool needed
    expect: str | Expect | None  # a regex (case-insensitive); None: any plain answer
    check: Callable[[Run], bool] | None = None  # a look at the world after the turn

    @property
    def world_fact(self) -> bool:
        """Whether the answer exists only in the fixture world (a person's calendar, mail,
        memories, a made-up web page): there a right-looking answer without its tool is a
        guess (the model said the museum opens 9 to 5 without searching)."""
        return self.tool in WORLD_TOOLS


@dataclass
class Run:
    world: rw.World
    home: Path
    started: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))


def _clock_in(zone: str) -> Expect:
    """The local time in ``zone`` as an answer would write it (24 h or 12 h, +-2 minutes)."""

    def regex(run: Run) -> str:
        now = dt.datetime.now(ZoneInfo(zone))
        forms = []
        for delta in range(-3, 3):
            t = now + dt.timedelta(minutes=delta)
            h12 = t.hour % 12 or 12
            forms.append(f"{t.hour:02d}:{t.minute:02d}")
            forms.append(rf"\b{t.hour}:{t.minute:02d}")
            forms.append(rf"\b{h12}:{t.minute:02d}\s*[ap]\.?m")
        return "|".join(forms)

    return regex


def _today(fmt: str) -> Expect:
    def regex(run: Run) -> str:
        today = dt.datetime.now(ZoneInfo(rw.ZONE)).date()
        if fmt == "weekday":
            return today.strftime("%A")
        return "|".join(
            (
                today.isoformat(),
                rf"{today.day}(st|nd|rd|th)?,? {today.strftime('%B')}",
                rf"{today.strftime('%B')} {today.day}(st|nd|rd|th)?\b",
                today.strftime("%d/%m/%Y"),
                today.strftime("%m/%d/%Y"),
            )
        )

    return regex


def _day_of(offset: int) -> Expect:
    def regex(run: Run) -> str:
        d = rw.day(offset)
        return "|".join(
            (
                d.isoformat(),
                d.strftime("%A"),
                rf"{d.strftime('%B')} {d.day}(st|nd|rd|th)?\b",
                rf"\b{d.day}(st|nd|rd|th)? {d.strftime('%B')}",
            )
        )

    return regex


def _cli(run: Run, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "chalie", "--home", str(run.home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=run.home,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(HERE))},
        check=False,
    )
    return out.stdout


def _mail_sent_to(address: str) -> Callable[[Run], bool]:
    def check(run: Run) -> bool:
        smtp = run.world.smtp
        return smtp is not None and any(address in " ".join(rcpt) for _, rcpt, _ in smtp.received)

    return check


def _reminder_about(*words: str) -> Callable[[Run], bool]:
    """A pending reminder names one of ``words`` ("call mom" is right for "call mum")."""
    return lambda run: any(w in _cli(run, "reminders", "list").lower() for w in words)


def _event_titled(word: str) -> Callable[[Run], bool]:
    def check(run: Run) -> bool:
        out = _cli(
            run,
            "tools",
            "call",
            "calendar",
            f"start={rw.day(1).isoformat()}",
            f"end={rw.day(2).isoformat()}",
        )
        return word in out.lower()

    return check


def _memory_holds(word: str) -> Callable[[Run], bool]:
    return lambda run: word in _cli(run, "memory", "search", word).lower()


PROMPTS: Final = (
    # clock
    Prompt("clock-tokyo", "What time is it in Tokyo right now?", "clock", _clock_in("Asia/Tokyo")),
    Prompt("clock-sydney", "What's the time in Sydney?", "clock", _clock_in("Australia/Sydney")),
    Prompt("clock-date", "What's today's date?", "clock", _today("date")),
    Prompt("clock-weekday", "What day of the week is it today?", "clock", _today("weekday")),
    Prompt(
        "clock-convert",
        "If it's 9am in Berlin, what time is it in Singapore?",
        "clock",
        r"\b4(:00)?\s*p\.?m|\b16[:.]00|\b16h",
    ),
    # calculator
    Prompt("calc-product", "What is 17 * 23?", "calculator", r"\b391\b"),
    Prompt("calc-percent", "What's 15% of 240?", "calculator", r"\b36(\.0+)?\b"),
    Prompt("calc-big", "Calculate 1234 * 5678.", "calculator", r"7,?006,?652"),
    Prompt("calc-root", "What is the square root of 7569?", "calculator", r"\b87(\.0+)?\b"),
    Prompt(
        "calc-split",
        "We are 3 people and the bill is 184.50 euros. How much does each of us pay?",
        "calculator",
        r"61[.,]50?\b",
    ),
    # weather
    Prompt(
        "weather-valletta", "What's the weather like in Valletta?", "weather", r"24[.,]1|\b24\b"
    ),
    Prompt(
        "weather-cold",
        "Is it cold in Reykjavik right now?",
        "weather",
        "[-\u2212\u2013]\\s?3[.,]5|minus 3",
    ),
    Prompt(
        "weather-fahrenheit",
        "What's the temperature in Lisbon in Fahrenheit?",
        "weather",
        r"63[.,]0|\b63\b|63[.,]\d",
    ),
    Prompt(
        "weather-snow",
        "Is it snowing in Reykjavik?",
        "weather",
        r"\byes\b|slight snow|snow ?fall|(?<!not )(?<!n't )\bsnowing\b",
    ),
    # calendar
    Prompt("cal-tomorrow", "What's on my calendar tomorrow?", "calendar", r"dentist"),
    Prompt("cal-lunch", "When is my lunch with Maria?", "calendar", _day_of(3)),
    Prompt(
        "cal-today", "Do I have any meetings today?", "calendar", r"standup|stand-up|\b0?9[:.]30"
    ),
    Prompt(
        "cal-add",
        "Put a meeting with Bob on my calendar tomorrow at 10am.",
        "calendar",
        r"(added|created|scheduled|booked|set up|put)",
        check=_event_titled("bob"),
    ),
    # contacts
    Prompt("contacts-phone", "What's Maria Lopez's phone number?", "contacts", r"2123\s?4567"),
    Prompt(
        "contacts-email",
        "What is Bob Smith's email address?",
        "contacts",
        r"bob\.smith@example\.org",
    ),
    Prompt(
        "contacts-missing",
        "Do I have a contact called Peter Grech?",
        "contacts",
        r"\bno\b|not|couldn't|could not|don't|do not",
    ),
    # email
    Prompt(
        "mail-bob",
        "Did Bob send me an email? What was it about?",
        "email",
        r"quarterly|report|revenue",
    ),
    Prompt(
        "mail-keys", "Where did Carla say she left the spare keys?", "email", r"flower ?pot|pot"
    ),
    Prompt("mail-count", "How many emails are in my inbox?", "email", r"\b3\b|three"),
    Prompt(
        "mail-send",
        "Send an email to maria.lopez@example.org telling her I'll be 10 minutes late.",
        "email",
        r"sent|done|email",
        check=_mail_sent_to("maria.lopez@example.org"),
    ),
    # reminders
    Prompt(
        "remind-mum",
        "Remind me to call mum tomorrow at 6pm.",
        "reminder",
        r"remind|set|will",
        check=_reminder_about("mum", "mom", "mother"),
    ),
    Prompt(
        "remind-stretch",
        "Remind me in two hours to stretch.",
        "reminder",
        r"remind|set|will",
        check=_reminder_about("stretch"),
    ),
    Prompt("remind-list", "What reminders do I have?", "reminder", r"plants"),
    # memory
    Prompt("memory-sister", "What's my sister's name?", "memory", r"\bAna\b"),
    Prompt("memory-work", "Where do I work?", "memory", r"Acme"),
    Prompt(
        "memory-store",
        "Please remember that my favourite colour is green.",
        "memory",
        r"remember|noted|got it|saved|stored|green",
        check=_memory_holds("green"),
    ),
    # the web
    Prompt(
        "web-museum",
        "Search the web: when is the Grand Harbour Maritime Museum open?",
        "web_search",
        "9(:00)?\\s*(am|a\\.m\\.)?\\s*(to|-|\u2013|until|and)\\s*(17|5)",
    ),
    Prompt(
        "web-regatta",
        "Look up online who won the 2026 Valletta regatta.",
        "web_search",
        r"Marsamxett",
    ),
    Prompt(
        "web-menu", "Open {site}/menu and tell me what today's soup is.", "web_browse", r"lentil"
    ),
    # MCP
    Prompt(
        "mcp-list",
        "Which MCP servers are connected to you?",
        "mcp_manager",
        r"\bno\b|none|not|aren't|zero|0",
    ),
    # no tool needed
    Prompt("chat-hello", "Hello!", None, None),
    Prompt("chat-thanks", "Thanks, that's all for now.", None, None),
    Prompt("chat-how", "How are you today?", None, None),
    Prompt("chat-capital", "What is the capital of France?", None, r"Paris"),
    Prompt("chat-hamlet", "Who wrote Hamlet?", None, r"Shakespeare"),
    Prompt(
        "chat-spanish", "How do you say 'good morning' in Spanish?", None, r"buen[oa]s? d[ií]as"
    ),
    Prompt("chat-joke", "Tell me a short joke.", None, None),
    Prompt(
        "chat-currency",
        "Convert 300 US dollars to euros.",
        None,
        r"euro|EUR|€",
    ),
)

# What the daemon knows before the prompts run (seeded through the CLI, as a person would).
SEED_MEMORIES: Final = ("My sister's name is Ana.", "I work at Acme Corp as an engineer.")
SEED_REMINDERS: Final = ("water the plants",)


# -- the judge ----------------------------------------------------------------------------

_MARKUP: Final = re.compile(
    r"</?(tools?|tool_call|tool_response|function_call|functions?)\b[^>]*>|\[end:[\w-]+\]|"
    r"\[[\w-]+\(status=",
    re.I,
)
_DESCRIBED: Final = re.compile(
    r"(you|we|i) (can|could|would|will|should|need to|may) (call|use|invoke|run)\s+"
    r"(the\s+)?`?\w+`?\s+(function|tool)|"
    r"(call|use|invoke) (the )?`\w+` (function|tool)|"
    r"(following|this) (function call|python code|code|json)|"
    r"```(python|json|bash)|"
    r"\"(name|arguments)\"\s*:|"
    r"\bfind_tools\b|\bfind_skills\b|\bact_summary\b",
    re.I,
)


REFUSAL: Final = re.compile(r"\b(?:can't|cannot|can not|unable to) (?:assist|help)\b", re.I)


def unfit(text: str) -> str:
    """Why an answer is no use to a person ('' when it is one): empty, markup, a described call."""
    stripped = text.strip()
    if not stripped:
        return "empty"
    if _MARKUP.search(stripped):
        return "markup"
    if not re.search(r"[A-Za-z0-9]", re.sub(r"```\w*|<[^>]*>", "", stripped)):
        return "markup"
    if _DESCRIBED.search(stripped):
        return "described"
    return ""


# -- a recording proxy between the daemon and the model server ------------------------------


@dataclass
class Exchange:
    at: float
    seconds: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    tools: list[str]
    messages: int
    request: dict[str, Any]
    content: str
    tool_calls: list[Any]


class Recorder:
    """Forwards chat completions to the model server and keeps what went through."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.exchanges: list[Exchange] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, ctype, data = recorder.forward(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                status, ctype, data = recorder.forward(self.path, None)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, path: str, body: bytes | None) -> tuple[int, str, bytes]:
        started = time.monotonic()
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=900)
        try:
            conn.request(
                "POST" if body is not None else "GET",
                path,
                body=body,
                headers={"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            data = resp.read()
            ctype = resp.getheader("Content-Type") or "application/json"
            status = resp.status
        finally:
            conn.close()
        if body is not None and path.endswith("/chat/completions") and status == 200:
            self._record(started, json.loads(body), data)
        return status, ctype, data

    def _record(self, started: float, request: dict[str, Any], data: bytes) -> None:
        content, calls, usage, timings = "", [], {}, {}
        text = data.decode(errors="replace")
        if request.get("stream"):
            for line in text.splitlines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                try:
                    chunk = json.loads(line[5:])
                except ValueError:
                    continue
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    content += delta.get("content") or ""
                    calls.extend(delta.get("tool_calls") or [])
        else:
            whole = json.loads(text)
            usage, timings = whole.get("usage") or {}, whole.get("timings") or {}
            message = whole["choices"][0]["message"]
            content, calls = message.get("content") or "", message.get("tool_calls") or []
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int(timings.get("cache_n") or 0)
        tools = [t["function"]["name"] for t in request.get("tools") or []] or listed(
            str((request.get("messages") or [{}])[0].get("content") or "")
        )
        with self.lock:
            self.exchanges.append(
                Exchange(
                    at=started,
                    seconds=time.monotonic() - started,
                    prompt_tokens=prompt,
                    cached_tokens=cached,
                    output_tokens=int(usage.get("completion_tokens") or 0),
                    tools=tools,
                    messages=len(request.get("messages") or []),
                    request=request,
                    content=content,
                    tool_calls=calls,
                )
            )

    def since(self, t0: float) -> list[Exchange]:
        with self.lock:
            return [e for e in self.exchanges if e.at >= t0]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the daemon -------------------------------------------------------------------------


class Daemon:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.log = open(home / "daemon.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chalie", "--home", str(home), "run"],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            env=env,
            cwd=home,  # not the checkout: python -m would import the code in the current folder
        )
        self.cli("status", "--wait", "180")

    def cli(
        self, *args: str, stdin: str | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "chalie", "--home", str(self.home), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.home,
            check=False,
        )

    def stop(self) -> None:
        self.cli("stop")
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


ALLOW: Final = (
    "clock", "calculator", "weather", "calendar", "contacts", "email", "reminder", "memory",
    "web_search", "web_browse", "mcp_manager", "calendar.create_event", "email.send",
    "reminder.set", "memory.store",
)  # fmt: skip


def prepare(home: Path, world: rw.World, model_url: str, alias: str) -> None:
    (home / "config.toml").write_text(
        "[mcp_server]\nport = 0\n[chat]\nport = 0\n"
        + world.config()
        + "[models.default]\n"
        + 'provider = "openai"\n'
        + f'base_url = "{model_url}/v1"\n'
        + f'model = "{alias}"\n'
        # a runaway answer of a small model otherwise writes 4096 tokens (13 min at 5/s)
        + "context_window = 16384\nmax_output_tokens = 1024\nread_timeout = 900.0\n"
    )


def seed(d: Daemon, world: rw.World) -> None:
    for channel in ("chat", "subconscious"):
        for permission in ALLOW:
            out = d.cli("policy", "set", channel, permission, "allow")
            if out.returncode != 0:
                print(f"  policy {channel} {permission}: {out.stderr.strip()[:200]}")
    for args, password in world.accounts():
        out = d.cli("accounts", "add", *args, stdin=(password or "") + "\n")
        if out.returncode != 0:
            print(
                f"  accounts add {args[:2]}: {out.stdout.strip()[:200]} {out.stderr.strip()[:200]}"
            )
    for text in SEED_MEMORIES:
        out = d.cli("tools", "call", "memory", "action=store", f"text={text}", stdin="o\n")
        if out.returncode != 0:
            print(f"  memory seed: {out.stdout.strip()[:300]} {out.stderr.strip()[:200]}")
    for text in SEED_REMINDERS:
        out = d.cli("reminders", "add", "--after", "3d", text)
        if out.returncode != 0:
            print(f"  reminder seed: {out.stdout.strip()[:300]} {out.stderr.strip()[:200]}")


# -- one turn -----------------------------------------------------------------------------


@dataclass
class Outcome:
    prompt: str
    answer: str
    reason: str
    tools: list[tuple[str, str]]  # (tool, status)
    seconds: float
    exchanges: list[Exchange]
    right: bool = False
    via_tool: bool = False
    unfit: str = ""
    error: str = ""


def conversation_tools(d: Daemon, cid: str) -> tuple[list[tuple[str, str]], str, str]:
    """(tool, status) of each call, the last answer and how the turn ended, from the history."""
    out = d.cli("conversations", "show", cid, "--json")
    try:
        data = json.loads(out.stdout)
    except ValueError:
        return [], "", "?"
    tools: list[tuple[str, str]] = []
    answer = ""
    for m in data.get("messages", []):
        if m.get("role") == "tool":
            status = re.search(r"status=([\w-]+)", m.get("text", ""))
            tools.append((str(m.get("tool", "")), status.group(1) if status else "?"))
        elif m.get("role") == "assistant" and not m.get("tool_calls"):
            answer = m.get("text", "")
    turns = data.get("turns") or [{}]
    return tools, answer, str(turns[-1].get("reason") or "?")


def newest_conversation(d: Daemon) -> str:
    out = d.cli("conversations", "list", "--json", "--limit", "1")
    try:
        data = json.loads(out.stdout)
    except ValueError:
        return ""
    rows = data if isinstance(data, list) else data.get("conversations", [])
    return str(rows[0].get("conversation_id") or rows[0].get("id")) if rows else ""


def run_turn(d: Daemon, recorder: Recorder, text: str, via: str) -> Outcome:
    t0 = time.monotonic()
    if via == "ask":
        out = d.cli("ask", "--json", "--timeout", "900", text)
        seconds = time.monotonic() - t0
        try:
            data = json.loads(out.stdout)
        except ValueError:
            return Outcome(
                text,
                "",
                "error",
                [],
                seconds,
                recorder.since(t0),
                error=(out.stderr or out.stdout)[-300:],
            )
        cid = str(data.get("conversation_id", ""))
    else:
        out = d.cli("chat", stdin=text + "\n")
        seconds = time.monotonic() - t0
        cid = newest_conversation(d)
    tools, answer, reason = conversation_tools(d, cid) if cid else ([], out.stdout.strip(), "?")
    return Outcome(text, answer, reason, tools, seconds, recorder.since(t0))


def judge(p: Prompt, o: Outcome, run: Run) -> None:
    o.unfit = unfit(o.answer) if o.reason in ("final", "?") else (o.reason or "error")
    if o.unfit:
        return
    expect = p.expect(run) if callable(p.expect) else p.expect
    ok = expect is None or re.search(expect, o.answer, re.I) is not None
    if p.check is not None:
        ok = ok and p.check(run)
    if p.tool is None and any(t == "memory" for t, _ in o.tools):
        ok = False  # nothing in these prompts is about the person: the memory tool took over
    if expect is None and REFUSAL.search(o.answer):
        ok = False  # "tell me a joke" -> "I'm sorry, but I can't assist with that request."
    o.via_tool = (
        ok and p.tool is not None and any(t == p.tool and s == "success" for t, s in o.tools)
    )
    o.right = ok and (o.via_tool or not p.world_fact)


# -- the report ------------------------------------------------------------------------------


def report(results: dict[str, list[Outcome]], runs: int, label: str) -> dict[str, Any]:
    total = right = needing = needing_right = calls = failed = unfit_n = 0
    first_tokens: list[int] = []
    all_tokens: list[int] = []
    prompt_sum = cached_sum = 0
    seconds: list[float] = []
    print(f"\n== {label}")
    print(
        f"{'prompt':20} {'right':>6} {'tool':>6} {'calls':>6} {'failed':>6} {'unfit':>6} "
        f"{'tok1':>5} {'s/turn':>7}"
    )
    for p in PROMPTS:
        outs = results.get(p.id)
        if not outs:
            continue
        r = sum(o.right for o in outs)
        v = sum(o.via_tool for o in outs)
        c = sum(len(o.tools) for o in outs)
        f = sum(s != "success" for o in outs for _, s in o.tools)
        u = sum(bool(o.unfit) and o.unfit not in ("final",) for o in outs)
        firsts = [o.exchanges[0].prompt_tokens for o in outs if o.exchanges]
        sec = statistics.median(o.seconds for o in outs)
        tool_col = f"{v}/{len(outs)}" if p.tool else "-"
        print(
            f"{p.id:20} {r}/{len(outs):<4} {tool_col:>6} {c:>6} {f:>6} {u:>6} "
            f"{(statistics.median(firsts) if firsts else 0):>5.0f} {sec:>7.1f}"
        )
        total += len(outs)
        right += r
        calls += c
        failed += f
        unfit_n += u
        if p.tool:
            needing += len(outs)
            needing_right += v
        first_tokens += firsts
        for o in outs:
            seconds.append(o.seconds)
            for e in o.exchanges:
                all_tokens.append(e.prompt_tokens)
                prompt_sum += e.prompt_tokens
                cached_sum += e.cached_tokens
    share = right / total if total else 0.0
    tool_share = needing_right / needing if needing else 0.0
    first = statistics.median(first_tokens) if first_tokens else 0
    print(
        f"\n  answered right: {right}/{total} = {share:.0%}   floor {RIGHT_FLOOR:.0%}   "
        f"ratio {share / RIGHT_FLOOR:.2f}"
    )
    print(
        f"  right through the tool: {needing_right}/{needing} = {tool_share:.0%}   floor "
        f"{TOOL_FLOOR:.0%}   ratio {tool_share / TOOL_FLOOR:.2f}"
    )
    print(
        f"  calls made {calls}, failed {failed}; "
        f"turns without a usable answer (markup, described call, empty, guard): {unfit_n}"
    )
    print(
        f"  first request: median {first:.0f} prompt tokens (max {max(first_tokens or [0])})   "
        f"floor <= {TOKEN_FLOOR}   ratio {first / TOKEN_FLOOR:.2f}"
    )
    if all_tokens:
        print(
            f"  every request: median {statistics.median(all_tokens):.0f} prompt tokens; "
            f"prompt cache hit {cached_sum}/{prompt_sum} = "
            f"{cached_sum / max(prompt_sum, 1):.0%} of prompt tokens"
        )
    if seconds:
        print(
            f"  seconds a turn: median {statistics.median(seconds):.1f}, worst {max(seconds):.1f}"
        )
    return {
        "right": right, "total": total, "via_tool": needing_right, "needing": needing,
        "calls": calls, "failed": failed, "unfit": unfit_n, "first_tokens": first,
    }  # fmt: skip


# -- main ---------------------------------------------------------------------------------------


def show(r: int, p: Prompt, o: Outcome) -> None:
    """One line a turn, as it ends."""
    mark = "ok " if o.right else "-- "
    tools = ",".join(f"{t}:{s[:3]}" for t, s in o.tools) or "-"
    unfit = f"unfit={o.unfit} " if o.unfit else ""
    answer = " ".join(o.answer.split())[:160]
    print(
        f"{mark}[{r + 1}] {p.id:18} {o.seconds:6.1f}s {o.reason:12} tools={tools} "
        f"{unfit}:: {answer}",
        flush=True,
    )


def from_transcripts(paths: list[Path]) -> dict[str, list[Outcome]]:
    """The outcomes written by --transcripts, judged as they were when they ran."""
    results: dict[str, list[Outcome]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            d = json.loads(line)
            exchanges = [
                Exchange(
                    at=0.0,
                    seconds=float(e.get("seconds", 0.0)),
                    prompt_tokens=e["prompt_tokens"],
                    cached_tokens=e["cached"],
                    output_tokens=0,
                    tools=e["tools"],
                    messages=len(e.get("messages") or []),
                    request={},
                    content=e["content"],
                    tool_calls=e["tool_calls"],
                )
                for e in d["exchanges"]
            ]
            seconds = d.get("seconds") or sum(e.seconds for e in exchanges)
            prompt = next((p for p in PROMPTS if p.id == d["prompt"]), None)
            guessed = prompt is not None and prompt.world_fact and not d["via_tool"]
            if prompt is not None and prompt.expect is None and REFUSAL.search(d["answer"]):
                guessed = True  # a refusal answers nothing
            o = Outcome(
                d.get("prompt", ""), d["answer"], d["reason"],
                [(t, s) for t, s in d["tools"]], seconds, exchanges,
                right=d["right"] and not guessed, via_tool=d["via_tool"], unfit=d["unfit"],
            )  # fmt: skip
            results.setdefault(d["prompt"], []).append(o)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--via", choices=("chat", "ask"), default="chat")
    parser.add_argument("--model", choices=sorted(real_model.MODELS), default="1.5b")
    parser.add_argument("--only", default="", help="comma-separated prompt ids (or id prefixes)")
    parser.add_argument("--code", type=Path, help="run the daemon from this checkout")
    parser.add_argument("--model-url", help="use a model server already running here")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--transcripts", type=Path, help="write every exchange here (JSON lines)")
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="print the table again from these transcripts (runs of the same code, added up)",
    )
    args = parser.parse_args()
    if args.report:
        report(
            from_transcripts(args.report),
            0,
            args.label or "from " + ", ".join(map(str, args.report)),
        )
        return 0
    if args.code is not None and other_code.running_other_code() is None:
        return other_code.reexec_with(Path(__file__), args.code.resolve(), sys.argv[1:])
    wanted = [w for w in args.only.split(",") if w]
    prompts = [p for p in PROMPTS if not wanted or any(p.id.startswith(w) for w in wanted)]
    model = real_model.MODELS[args.model]
    server: subprocess.Popen[bytes] | None = None
    model_url = args.model_url
    if model_url is None:
        port = rw.servers.free_port()
        server = subprocess.Popen(
            real_model.serve_argv(model, port, args.threads, 16384),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        model_url = f"http://127.0.0.1:{port}"
        real_model.wait_healthy(model_url, server)
    recorder = Recorder(model_url)
    home = Path(tempfile.mkdtemp(prefix="chrm-", dir="/tmp"))
    env = {
        **os.environ,
        "CHALIE_HOME": str(home),
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(HERE)),
    }
    results: dict[str, list[Outcome]] = {}
    transcripts = args.transcripts.open("w") if args.transcripts else None
    code = other_code.running_other_code() or str(HERE)
    label = (
        args.label or f"{model.alias} via chalie {args.via}, daemon code {code}, {args.runs} run(s)"
    )
    try:
        with rw.world() as world:
            prepare(home, world, recorder.url, model.alias)
            where = subprocess.run(
                [sys.executable, "-c", "import chalie; print(chalie.__file__)"],
                capture_output=True, text=True, env=env, cwd=home, check=False,
            )  # fmt: skip
            print(f"the daemon's code: {where.stdout.strip()}", flush=True)
            d = Daemon(home, env)
            try:
                seed(d, world)
                run = Run(world, home)
                for r in range(args.runs):
                    for p in prompts:
                        text = p.text.replace("{site}", world.http.url)
                        o = run_turn(d, recorder, text, args.via)
                        judge(p, o, run)
                        results.setdefault(p.id, []).append(o)
                        show(r, p, o)
                        if transcripts is not None:
                            transcripts.write(
                                json.dumps(
                                    {
                                        "prompt": p.id,
                                        "run": r,
                                        "seconds": round(o.seconds, 2),
                                        "answer": o.answer,
                                        "reason": o.reason,
                                        "tools": o.tools,
                                        "right": o.right,
                                        "via_tool": o.via_tool,
                                        "unfit": o.unfit,
                                        "exchanges": [
                                            {
                                                "prompt_tokens": e.prompt_tokens,
                                                "cached": e.cached_tokens,
                                                "tools": e.tools,
                                                "messages": e.request.get("messages"),
                                                "params": {
                                                    k: v
                                                    for k, v in e.request.items()
                                                    if k != "messages"
                                                },
                                                "content": e.content,
                                                "tool_calls": e.tool_calls,
                                                "seconds": round(e.seconds, 2),
                                            }
                                            for e in o.exchanges
                                        ],
                                    }
                                )
                                + "\n"
                            )
                            transcripts.flush()
            finally:
                d.stop()
        report(results, args.runs, label)
    finally:
        recorder.close()
        if transcripts is not None:
            transcripts.close()
        if server is not None:
            server.terminate()
            server.wait(30)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
