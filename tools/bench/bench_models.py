"""How often a sloppy small model ends with the right tool's result; what a first request costs.

Runs every conversation of :mod:`tools.fake_llm.sloppy` (the habits of 1-8B
models seen driving Chalie through llama.cpp's OpenAI-compatible server: calls
written as text, a missing act_summary, copied example values, invented names,
a bare array, empty answers, a repeat after a result, find_tools for "hello",
and clean conversations) through a real daemon in this process, and prints:

1. The share of conversations that end with the right answer (the right tool's
   result, or a plain answer where no tool fits), per pattern and in all.
   Floor: 1.0 (every conversation here has a recoverable intent).
2. The prompt tokens of a first request: the system prompt plus the pinned
   tools' schemas as sent on the wire (whatever the channel pins, counted with
   the runtime's own estimate, 4 characters a token), for the find_tools
   channel and the pinned-tools channel, and the whole first request body.
   Floor: <= 400 tokens for system prompt + pinned schemas.

``--code DIR`` runs the daemon from another checkout (e.g. main, for the
figures before): the scripted model and these scripts stay this checkout's.

Run: ``python tools/bench/bench_models.py [--code DIR] [--only NAME]``

Measured December 2026 (shared 2-core machine; the figures are counts, not timings),
43 conversations: main before this work (``--code`` a ``git archive main``) 5/43 = 0.12
right (the 4 clean ones and a copied act_summary); this branch 43/43 = 1.00. First
request, system prompt + pinned schemas on the wire: shipped chat 639 -> 340 tokens,
find_tools channel 557 -> 313, clock + calculator pinned 484 -> 383 (floor <= 400).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
sys.path.append(str(HERE))  # after PYTHONPATH: --code puts the other checkout first

from tools.bench import other_code  # noqa: E402

SHARE_FLOOR = 1.0
TOKEN_FLOOR = 400
CHARS_PER_TOKEN = 4


def config_toml(url: str) -> str:
    lines = ["[chat]", "port = 0", "[mcp_server]", "port = 0"]
    for wire in ("openai", "ollama"):
        base = url + ("/v1" if wire == "openai" else "")
        lines += [f"[models.{wire}]", f'provider = "{wire}"', f'base_url = "{base}"']
        lines += ['model = "scripted"', "retries = 1", "backoff = 0.01"]
        lines += [f"[channels.sloppy-finding-{wire}]", f'model = "{wire}"']
        lines += [f"[channels.sloppy-direct-{wire}]", f'model = "{wire}"']
        lines += ['pinned = ["clock", "calculator"]', "find_tools = false"]
    lines += ["[models.default]", f'base_url = "{url}/v1"', 'model = "scripted"']
    return "\n".join(lines) + "\n"


def prompt_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(system prompt + tool schemas, the whole body) in estimated tokens, any wire."""
    system = body.get("system") or ""
    for message in body.get("messages") or []:
        if message.get("role") == "system":
            system = message.get("content") or ""
    fixed = len(json.dumps(system)) + len(json.dumps(body.get("tools") or []))
    return fixed // CHARS_PER_TOKEN + 1, len(json.dumps(body)) // CHARS_PER_TOKEN + 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", type=Path, help="run the daemon from this checkout")
    parser.add_argument("--only", help="run only the conversations whose name contains this")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.code is not None and other_code.running_other_code() is None:
        return other_code.reexec_with(Path(__file__), args.code.resolve(), sys.argv[1:])

    import logging

    logging.disable(logging.WARNING)
    from actors.conversation.conversations import Conversations
    from actors.gate.policy import PolicyActor
    from chalie.conversation.requests import SendMessage
    from chalie.process.config import Config
    from chalie.wire.events import TurnFinished
    from chalie_app import root
    from tools.fake_llm import FakeModelServer, load_script
    from tools.fake_llm.script import Player
    from tools.fake_llm.sloppy import library

    cases = [c for c in library() if not args.only or args.only in c.name]
    server = FakeModelServer(load_script("{}")).start()
    home = Path(tempfile.mkdtemp(prefix="bench-models-home-"))
    (home / "config.toml").write_text(config_toml(server.url))
    ready = threading.Event()
    box: dict[str, Any] = {}

    def on_ready(rt: Any) -> None:
        box["rt"] = rt
        ready.set()

    thread = threading.Thread(
        target=root.run, args=(Config.load(home),), kwargs={"ready": on_ready}, daemon=True
    )
    thread.start()
    if not ready.wait(120):
        raise SystemExit("the daemon did not start")
    rt = box["rt"]
    ended: dict[str, Any] = {}
    lock = threading.Condition()

    def record(event: Any) -> None:
        if isinstance(event, TurnFinished):
            with lock:
                ended[event.turn_id] = event
                lock.notify_all()

    sub = rt.events.subscribe(None, record)
    code = other_code.running_other_code() or str(HERE)
    results: list[tuple[Any, bool, str, str]] = []
    firsts: dict[str, tuple[int, int]] = {}
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status = rt.supervisor.proxy().status().get(timeout=10)
                if not all(c["alive"] for c in status["children"]):
                    raise RuntimeError("the tree is still starting")
                policy = rt.child("policy", PolicyActor).within(10)
                for tool in ("clock", "calculator"):
                    policy.call(PolicyActor.set, "subconscious", tool, "allow")
                conversations = rt.child("conversations", Conversations).within(10)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the tree is still starting its children
        for case in cases:
            server.app.player = Player(load_script(json.dumps(case.script)))
            server.app.requests.clear()
            channel = f"sloppy-{case.kind}-{case.wire}"
            message = SendMessage(
                conversation_id=None, channel=channel, text=case.prompt, client_msg_id=""
            )
            if hasattr(Conversations, "submit"):  # the one conversations port
                accepted = conversations.call(Conversations.submit, message).result(10)
            else:  # a checkout from before it
                accepted = conversations.call(Conversations.send, message)
            turn_id = accepted.turn_id
            with lock:
                lock.wait_for(lambda t=turn_id: t in ended, timeout=60)  # type: ignore[misc]
                end = ended.get(turn_id)
            if end is None:
                results.append((case, False, "timeout", ""))
                continue
            ok = end.reason == "final" and case.expect in end.text
            results.append((case, ok, end.reason, end.text))
            if server.app.requests and channel not in firsts:
                firsts[channel] = prompt_tokens(server.app.requests[0]["body"])
            if args.verbose or not ok:
                shown = " ".join(end.text.split())[:160]
                print(f"  {'ok  ' if ok else 'FAIL'} {case.name:<34} {end.reason:<13} {shown}")
        # The shipped chat channel (pins find_tools and find_skills, offers async): its
        # first request, for the token figure only.
        server.app.player = Player(load_script(json.dumps({"on_user": {"text": "Hi."}})))
        server.app.requests.clear()
        message = SendMessage(conversation_id=None, channel="chat", text="hi", client_msg_id="")
        if hasattr(Conversations, "submit"):
            accepted = conversations.call(Conversations.submit, message).result(10)
        else:
            accepted = conversations.call(Conversations.send, message)
        with lock:
            lock.wait_for(lambda: accepted.turn_id in ended, timeout=60)
        if server.app.requests:
            firsts["chat (shipped)"] = prompt_tokens(server.app.requests[0]["body"])
    finally:
        sub.close()
        rt.request_stop()
        thread.join(60)
        server.stop()

    by_pattern: dict[str, list[bool]] = defaultdict(list)
    for case, ok, _, _ in results:
        by_pattern[case.pattern].append(ok)
    print(f"\nbench_models: daemon code from {code}")
    for pattern, oks in sorted(by_pattern.items()):
        print(f"  {pattern:<16} {sum(oks)}/{len(oks)}")
    right = sum(ok for _, ok, _, _ in results)
    share = right / len(results) if results else 0.0
    print(
        f"1. right answer: {right}/{len(results)} = {share:.2f}   floor {SHARE_FLOOR:.2f}   "
        f"ratio {share / SHARE_FLOOR:.2f}"
    )
    for channel, (fixed, whole) in sorted(firsts.items()):
        print(
            f"2. first request on {channel:<22} system+schemas {fixed:>4} tokens   "
            f"floor <= {TOKEN_FLOOR}   ratio {fixed / TOKEN_FLOOR:.2f}   (whole body {whole})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
