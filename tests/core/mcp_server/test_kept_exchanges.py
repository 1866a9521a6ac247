"""loop_in_human exchanges are kept for owners who connect later: a real daemon (``chalie run``),
a real agent (the MCP SDK's client), ``chalie chat`` on a terminal, the CLI and the Brain's REST.

1. An owner is connected when an agent's turn needs an approval; they leave unanswered.
   ``chalie chat`` started afterwards is asked, and its answer lets the agent's turn go on.
2. With nobody connected, the agent's next exchange is kept: ``chalie token exchanges`` and
   the Brain list it as new, the next ``chalie chat`` shows it, and then it is seen.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
from typing import Any

import httpx2
import pytest

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from tests.core.chat.test_cli_chat import Terminal
from tests.core.mcp_server.harness import connect
from tests.core.mcp_server.test_loop_in_human_asks import ARGS
from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm.script import load_script
from tools.fake_llm.server import FakeModelServer
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

CLOCK_TURN = [
    {"tool_calls": [{"name": "find_tools", "arguments": {"query": ["clock"]}}]},
    {"tool_calls": [{"name": "clock", "arguments": {"action": "now", "zone": "UTC"}}]},
    {"text": "It is noon in UTC."},
]


def _secret(d: DaemonProcess, name: str, *flags: str) -> str:
    made = d.cli_process("token", "create", name, *flags)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[0]


def _talk(url: str, secret: str, args: dict[str, Any]) -> Any:
    async def go() -> Any:
        async with connect(url, secret, "auto") as client:
            return await client.call_tool("talk_to_chalie", args)

    return asyncio.run(go())


def _people(d: DaemonProcess) -> int:
    server: dict[str, int] = d.status()["mcp_server"]  # type: ignore[assignment]
    return server["people_connected"]


def _kept(d: DaemonProcess) -> list[dict[str, Any]]:
    listed = d.cli_process("token", "exchanges", "--json")
    assert listed.returncode == 0, listed.stderr
    found: list[dict[str, Any]] = json.loads(listed.stdout)
    return found


def test_an_agents_exchange_waits_for_the_owner_who_connects_later() -> None:
    script = {"steps": CLOCK_TURN * 2, "on_user": {"text": "done"}}
    with FakeModelServer(load_script(json.dumps(script))) as model:
        home = short_home()
        (home / "config.toml").write_text(
            "workers = 1\n[chat]\nport = 0\n"
            "[mcp_server]\nport = 0\nloop_in_human_asks = true\n"
            "[discovery]\nwrite_examples = false\n"
            f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
        )
        d = DaemonProcess(home, home / "daemon.log").start()
        try:
            agent = _secret(d, "travel")
            url = str(d.status()["mcp_server"]["url"])  # type: ignore[index]

            # 1. An owner is there when the approval is asked, and leaves without answering.
            results: list[Any] = []
            caller = threading.Thread(
                target=lambda: results.append(_talk(url, agent, ARGS)), daemon=True
            )
            with ChatClient.local(home) as first:
                first.send(p.Ping(id="hi"))  # the first frame opens the session
                wait_until(lambda: first.receive(0.5) is not None, 15, "the session")
                caller.start()
                asked = None
                while asked is None:
                    frame = first.receive(30)
                    assert frame is not None, "the owner was never asked"
                    if frame["type"] == "agent_exchange" and frame["phase"] == "permission":
                        asked = frame
                first.leave()  # as `chalie chat` does on exit: no longer a person present
            assert not results
            # ``chalie chat`` started later is asked the same question, and answers it.
            with Terminal(home) as t:
                t.expect("asked for something that needs your approval")
                t.expect(asked["request_id"])
                t.expect("allow [o]nce, [a]lways, or [d]eny?")
                t.type("o")
                t.expect("Chalie answered agent 'travel-bot'")
                t.type("/quit")
                assert t.close() == 0
            caller.join(60)
            assert results and not results[0].is_error
            calls = [(c["tool"], c["status"]) for c in results[0].structured_content["tools"]]
            assert ("clock", "success") in calls

            # 2. Nobody connected (each client said bye: a ZeroMQ client that only went
            # away would count as present until [chat] idle_timeout, and the agent's ask
            # would wait for it): the next exchange is kept, new.
            wait_until(lambda: _people(d) == 0, 30, "the owners' byes")
            second = _talk(url, agent, ARGS)
            cid = second.structured_content["conversation_id"]
            kept = [k for k in _kept(d) if k["conversation_id"] == cid]
            assert [(k["phase"], k["seen"]) for k in kept] == [
                ("answered", False),
                ("asked", False),
            ]
            assert kept[1]["message"] == ARGS["message"] and kept[1]["agent_name"] == "travel-bot"
            shown = d.cli_process("token", "exchanges").stdout
            assert re.search(rf"new \[{cid}\] agent 'travel-bot' .* asked Chalie: what time", shown)

            # the Brain lists it too, for an owner token
            owner = _secret(d, "me", "--owner")
            brain = re.search(r"brain: (http://\S+)/brain", d.log())
            assert brain is not None, d.log()
            rows = httpx2.get(
                f"{brain.group(1)}/api/v1/exchanges",
                headers={"Authorization": f"Bearer {owner}"},
                timeout=30,
            ).json()
            assert [(r["phase"], r["seen"]) for r in rows if r["conversation_id"] == cid] == [
                ("answered", False),
                ("asked", False),
            ]
            assert any("asked Chalie: what time" in r["summary"] for r in rows)

            # the owner's next ``chalie chat`` shows it; then it is seen
            with Terminal(home) as t:
                t.expect("asked Chalie: what time is it in UTC?")
                t.expect("Chalie answered agent 'travel-bot'")
                t.type("/quit")
                assert t.close() == 0
            assert all(k["seen"] for k in _kept(d))
            with Terminal(home) as t:  # seen: not shown again
                shown = t.expect("you> ")
                t.type("/quit")
                assert t.close() == 0
            assert "asked Chalie" not in shown
        finally:
            assert d.signal(signal.SIGTERM) == 0
