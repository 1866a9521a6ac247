"""The control CLI against a real daemon process: status, tools call with the prompt, trail, policy.

One daemon serves most tests (module scope); drop-in abilities in its data
directory give it tools that ask, echo and sleep. The crash tests run their
own daemon and SIGKILL it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner

from chalie.process import control
from chalie_app.cli import cli
from chalie_app.cli.tools import parse_pairs
from tests.app.cli.test_imports import CONTROL_COMMANDS, check
from tests.daemon_process import DaemonProcess, short_home
from tools.processes import alive, descendants, reap, signal_state
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

DROPIN = textwrap.dedent(
    '''
    """Test abilities dropped into CHALIE_HOME/abilities."""
    import time

    from chalie.ability import Ability
    from chalie.result import ToolResult

    EXAMPLES = ("one", "two", "three", "four", "five", "six")


    class EchoTool(Ability):
        name = "echo_tool"
        summary = "Echoes its parameters back, exactly as the dispatcher handed them over."
        tooltip = "echo parameters"
        examples = EXAMPLES
        parameters = {"type": "object", "properties": {}, "additionalProperties": True}

        def run(self, params):
            return ToolResult.success({"got": params})


    class SlowTool(Ability):
        name = "slow_tool"
        summary = "Sleeps for a long time before it answers, to be caught in flight."
        tooltip = "sleep a while"
        examples = EXAMPLES
        timeout = 120.0

        def run(self, params):
            time.sleep(60)
            return ToolResult.success("slept")
    '''
)


def make_home() -> Path:
    home = short_home()
    (home / "abilities").mkdir()
    (home / "abilities" / "test_tools.py").write_text(DROPIN)
    return home


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    home = make_home()
    d = DaemonProcess(home, tmp_path_factory.mktemp("live") / "daemon.log").start()
    yield d
    try:
        assert d.signal(signal.SIGTERM) == 0
    finally:
        d.kill()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def clean_policy(live: DaemonProcess) -> Iterator[DaemonProcess]:
    assert live.cli("policy", "reset").returncode == 0
    yield live
    live.cli("policy", "reset")


def envelope_body(stdout: str) -> dict[str, object]:
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("[echo_tool(status=success") and lines[-1] == "[end:echo_tool]"
    parsed: dict[str, object] = json.loads("\n".join(lines[1:-1]))
    return parsed


# -- no daemon ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["trail"],
        ["policy", "list"],
        ["policy", "set", "chat", "clock", "allow"],
        ["policy", "reset"],
        ["tools", "call", "clock"],
    ],
)
def test_a_command_without_a_daemon_says_so_in_one_line_and_fails(
    tmp_path: Path, args: list[str]
) -> None:
    home = tmp_path / "home"
    result = CliRunner().invoke(cli, ["--home", str(home), *args])
    assert result.exit_code != 0
    assert result.stderr == (
        f"chalie: no daemon running on {home.resolve()} (start it with `chalie run`)\n"
    )
    assert result.stdout == ""


def test_stop_without_a_daemon_is_a_message_and_success(tmp_path: Path) -> None:
    # As `systemctl stop` of a stopped unit: the wanted state already holds.
    home = tmp_path / "home"
    result = CliRunner().invoke(cli, ["--home", str(home), "stop"])
    assert result.exit_code == 0, result.output
    assert "no daemon running" in result.stdout and "nothing to stop" in result.stdout


def test_stop_while_a_daemon_is_starting_stops_it(tmp_path: Path) -> None:
    # A daemon holds the lock from its first step but answers only once its tree is up (a
    # first index build can take a while): stop must not say "nothing to stop" meanwhile.
    home = tmp_path / "home"
    home.mkdir()
    starting = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import signal, sys, threading
                from pathlib import Path
                from chalie.process.daemon import instance_lock
                stop = threading.Event()
                signal.signal(signal.SIGTERM, lambda *_: stop.set())
                with instance_lock(Path({str(home)!r})):
                    print("locked", flush=True)
                    stop.wait(60)
                print("clean", flush=True)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starting.stdout is not None
        assert starting.stdout.readline().strip() == "locked"
        assert control.lock_holder(home) == starting.pid
        result = CliRunner().invoke(cli, ["--home", str(home), "stop", "--timeout", "20"])
        assert result.exit_code == 0, result.output
        assert f"daemon {starting.pid} was starting; stopped" in result.stdout
        assert starting.wait(10) == 0
        assert starting.stdout.read().strip() == "clean"  # its own clean stop, not a kill
        assert control.lock_holder(home) is False
    finally:
        if starting.poll() is None:
            starting.kill()
            starting.wait()
        if starting.stdout is not None:
            starting.stdout.close()


def test_the_habits_people_have(tmp_path: Path) -> None:
    from chalie import __version__

    runner = CliRunner()
    assert runner.invoke(cli, ["--version"]).stdout == f"chalie {__version__}\n"
    assert "Usage: chalie" in runner.invoke(cli, ["-h"]).stdout
    assert "Usage: chalie status" in runner.invoke(cli, ["status", "-h"]).stdout
    # --home after the command means the same as before it
    home = tmp_path / "after"
    after = runner.invoke(cli, ["status", "--home", str(home)])
    assert after.exit_code != 0 and str(home.resolve()) in after.stderr
    nested = runner.invoke(cli, ["policy", "list", "--home", str(home)])
    assert str(home.resolve()) in nested.stderr


def test_every_option_of_every_command_has_a_help_text() -> None:
    import click

    from chalie_app.cli.group import COMMANDS, load_all

    load_all()
    missing = []

    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and not param.help:
                missing.append(f"{path} {param.opts[0]}")
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")

    walk(cli, "chalie")
    assert missing == []
    # the one-line help `chalie --help` lists without importing is each command's own
    for name, (_modules, line) in COMMANDS.items():
        own = cli.commands[name].get_short_help_str(1000)
        assert own == line or (line.endswith("...") and own.startswith(line[:-3])), name


def test_tools_list_works_without_a_daemon() -> None:
    home = make_home()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "chalie", "--home", str(home), "tools", "list"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        names = {line.split()[0] for line in out.stdout.splitlines()}
        assert {"clock", "echo_tool", "slow_tool"} <= names
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- key=value parsing ---------------------------------------------------------------------


def test_pairs_parse_as_json_when_they_can_and_as_strings_otherwise() -> None:
    got = parse_pairs(("n=3", "f=1.5", "b=true", "s=hello world", 'o={"a":[1]}', "e=", 'q="7"'))
    assert got == {
        "n": 3,
        "f": 1.5,
        "b": True,
        "s": "hello world",
        "o": {"a": [1]},
        "e": "",
        "q": "7",
    }


@pytest.mark.parametrize("bad", [("novalue",), ("=3",), ("a=1", "a=2")])
def test_malformed_pairs_are_a_usage_error(bad: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, ["tools", "call", "clock", *bad])
    assert result.exit_code == 2
    assert "PARAMS" in result.stderr


# -- against the live daemon ------------------------------------------------------------------


def test_status_shows_actors_workers_uptime_pid_and_version(live: DaemonProcess) -> None:
    out = live.cli_process("status")
    assert out.returncode == 0, out.stderr
    assert f"pid {live.pid}" in out.stdout and "chalie 0.1.0" in out.stdout
    assert "[{" not in out.stdout and "{'" not in out.stdout  # no raw Python structures
    for child in ("policy", "dispatcher", "control"):
        assert any(line.split()[0] == child for line in out.stdout.splitlines() if line.strip())
    data = json.loads(live.cli("status", "--json").stdout)
    assert data["pid"] == live.pid and data["uptime"] > 0
    assert len(data["workers"]["workers"]) == 2
    assert {c["id"] for c in data["actors"]} >= {"policy", "dispatcher", "control"}
    assert all(c["restarts"] == 0 for c in data["actors"])
    assert data["loop"] is True  # the uvloop thread runs
    # where chat clients and agents reach it, and what the MCP server has seen
    assert isinstance(data["chat"], dict) and "websocket" in data["chat"]
    assert isinstance(data["mcp_server"], dict) and data["mcp_server"]["state"]
    lines = out.stdout.splitlines()
    assert any(line.startswith("chat: websocket ") for line in lines)
    assert any(line.startswith("mcp server: ") for line in lines)


def test_control_commands_against_a_live_daemon_load_nothing_heavy(
    clean_policy: DaemonProcess, tmp_path: Path
) -> None:
    """All the way through each reply (status prints every part, a call runs and ends)."""
    assert clean_policy.cli("policy", "set", "chat", "clock", "allow").returncode == 0
    assert clean_policy.cli("tools", "call", "clock", "action=now").returncode == 0  # a trail row
    for argv, extra in CONTROL_COMMANDS:
        if argv != ["stop"]:
            check(argv, extra, clean_policy.home, tmp_path / "modules.json")


def test_tools_call_asks_in_the_terminal_and_allow_once_runs_the_call(
    clean_policy: DaemonProcess,
) -> None:
    out = clean_policy.cli_process(
        "tools", "call", "echo_tool", "n=3", "word=hi", 'obj={"k":[1,2]}', input="o\n"
    )
    assert out.returncode == 0, out.stderr
    assert "permission requested: echo_tool on chat" in out.stderr
    assert envelope_body(out.stdout) == {"got": {"n": 3, "word": "hi", "obj": {"k": [1, 2]}}}
    # Once means once: the next call asks again (and a closed stdin denies).
    again = clean_policy.cli("tools", "call", "echo_tool", input="")
    assert again.returncode == 1
    assert "permission-denied" in again.stdout.splitlines()[0]


def test_deny_in_the_prompt_gives_the_error_envelope_and_a_nonzero_exit(
    clean_policy: DaemonProcess,
) -> None:
    out = clean_policy.cli("tools", "call", "echo_tool", "x=1", input="d\n")
    assert out.returncode == 1
    first = out.stdout.splitlines()[0]
    assert first.startswith("[echo_tool(status=error") and "code=permission-denied" in first


def test_allow_always_is_persisted_and_the_next_call_does_not_ask(
    clean_policy: DaemonProcess,
) -> None:
    assert clean_policy.cli("tools", "call", "echo_tool", input="a\n").returncode == 0
    out = clean_policy.cli("tools", "call", "echo_tool", "v=2", input="")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "permission requested" not in out.stderr
    listing = json.loads(clean_policy.cli("policy", "list", "--json").stdout)
    assert {"channel": "chat", "permission": "echo_tool", "decision": "allow"}.items() <= next(
        r for r in listing["rules"] if r["permission"] == "echo_tool"
    ).items()


def test_a_secret_parameter_reaches_the_tool_but_never_the_log_trail_or_prompt(
    clean_policy: DaemonProcess,
) -> None:
    d = clean_policy
    out = d.cli(
        "tools", "call", "echo_tool", "api_token=s3cr3t-xyz-42", "city=Valletta", input="o\n"
    )
    assert out.returncode == 0, out.stderr
    assert envelope_body(out.stdout) == {"got": {"api_token": "s3cr3t-xyz-42", "city": "Valletta"}}
    assert "s3cr3t-xyz-42" not in out.stderr  # the prompt shows redacted params
    assert "Valletta" in out.stderr
    row = json.loads(d.cli("trail", "--tool", "echo_tool", "--limit", "1", "--json").stdout)[0]
    assert json.loads(row["params"]) == {"api_token": "[redacted]", "city": "Valletta"}
    assert "s3cr3t-xyz-42" not in d.log()


def test_an_unknown_tool_is_an_error_envelope_and_a_nonzero_exit(live: DaemonProcess) -> None:
    out = live.cli("tools", "call", "no_such_tool", input="")
    assert out.returncode == 1
    assert "code=unknown-tool" in out.stdout.splitlines()[0]


def test_internal_tools_run_without_a_prompt(live: DaemonProcess) -> None:
    out = live.cli("tools", "call", "find_tools", 'query=["clock"]', input="")
    assert "permission requested" not in out.stderr
    assert out.stdout.startswith("[find_tools(")


def test_policy_set_and_reset_change_what_the_gate_does(clean_policy: DaemonProcess) -> None:
    d = clean_policy
    out = d.cli("policy", "set", "chat", "echo_tool", "deny")
    assert out.returncode == 0 and "chat echo_tool -> deny" in out.stdout
    denied = d.cli("tools", "call", "echo_tool", input="o\n")
    assert denied.returncode == 1 and "permission requested" not in denied.stderr
    assert d.cli("policy", "set", "chat", "echo_tool", "allow").returncode == 0
    assert d.cli("tools", "call", "echo_tool", input="").returncode == 0
    reset = d.cli("policy", "reset", "--channel", "chat", "--permission", "echo_tool")
    assert reset.returncode == 0 and "removed 1 rule" in reset.stdout
    assert d.cli("tools", "call", "echo_tool", input="").returncode == 1  # asks again; no answer


@pytest.mark.parametrize(
    "args",
    [
        ["policy", "set", "nowhere", "echo_tool", "allow"],
        ["policy", "set", "chat", "echo_tool", "internal"],
        ["policy", "reset", "--channel", "nope"],
    ],
)
def test_policy_rejects_bad_channels_and_decisions_as_usage_errors(
    live: DaemonProcess, args: list[str]
) -> None:
    out = live.cli(*args)
    assert out.returncode == 2


def test_policy_set_with_a_bad_permission_is_a_structured_error(live: DaemonProcess) -> None:
    out = live.cli("policy", "set", "chat", "Bad Permission!", "allow")
    assert out.returncode == 1
    assert out.stderr.startswith("chalie: invalid-args:")


def test_a_pending_approval_does_not_stall_status_and_shows_in_policy_list(
    clean_policy: DaemonProcess,
) -> None:
    d = clean_policy
    caller = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chalie",
            "--home",
            str(d.home),
            "tools",
            "call",
            "echo_tool",
            "k=1",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pending = wait_pending(d)
        assert pending[0]["permission"] == "echo_tool"
        status = d.cli_process("status", "--json", timeout=10)
        assert status.returncode == 0
        listing = d.cli("policy", "list")
        assert (
            "pending requests:" in listing.stdout
            and str(pending[0]["request_id"]) in listing.stdout
        )
        out, err = caller.communicate("o\n", timeout=30)
    finally:
        reap(caller)
    assert caller.returncode == 0, err
    assert envelope_body(out) == {"got": {"k": 1}}
    assert json.loads(d.cli("policy", "list", "--json").stdout)["pending"] == []


def wait_pending(d: DaemonProcess) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []

    def pending() -> bool:
        found[:] = json.loads(d.cli("policy", "list", "--json").stdout)["pending"]
        return bool(found)

    wait_until(pending, 30, what="a pending permission request")
    return found


def test_policy_answer_from_another_terminal_releases_the_call_and_ends_the_prompt(
    clean_policy: DaemonProcess,
) -> None:
    d = clean_policy
    caller = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(d.home), "tools", "call", "echo_tool"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pending = wait_pending(d)
        out = d.cli("policy", "answer", str(pending[0]["request_id"]), "once")
        assert out.returncode == 0
        # Nobody types at the first terminal, and its stdin stays open: the
        # prompt must notice the answer by itself and the call must finish.
        assert caller.wait(timeout=30) == 0
        assert caller.stdout is not None and caller.stderr is not None
        stdout, stderr = caller.stdout.read(), caller.stderr.read()
    finally:
        reap(caller)
    assert "answered elsewhere" in stderr
    assert "no answer; denying" not in stderr
    assert envelope_body(stdout) == {"got": {}}


def test_a_forged_prompt_line_in_act_summary_stays_inside_one_escaped_line(
    clean_policy: DaemonProcess,
) -> None:
    d = clean_policy
    # Within the descriptor's 200 characters, so validation lets it through to the gate.
    forged = 'copy\n  params {"safe": true}\u0007' + "z" * 150
    caller = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chalie",
            "--home",
            str(d.home),
            "tools",
            "call",
            "echo_tool",
            f"act_summary={forged}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_pending(d)
        _, stderr = caller.communicate("d\n", timeout=30)
    finally:
        reap(caller)
    lines = stderr.splitlines()
    assert sum(line.startswith("  params ") for line in lines) == 1
    assert "\x07" not in stderr
    summary = next(line for line in lines if line.startswith("  copy"))
    assert len(summary) <= 2 + 200


def test_tools_schema_is_the_daemons_input_schema_and_refuses_bad_names(
    live: DaemonProcess,
) -> None:
    """How `tools call` reads key=value: from the catalogue the call runs against."""
    client = control.ControlClient(live.home)
    try:
        found = client.call("tools.schema", {"tool": "calculator"})
        assert found.ok and found.data["tool"] == "calculator"
        assert found.data["input_schema"]["properties"]["expression"]["type"] == "string"
        assert "async" in found.data["input_schema"]["properties"]  # as a call may use it
        dropin = client.call("tools.schema", {"tool": "echo_tool"})
        assert dropin.ok and dropin.data["input_schema"]["additionalProperties"] is True
        missing = client.call("tools.schema", {"tool": "no_such_tool"})
        assert not missing.ok and missing.error == control.NOT_FOUND
        for bad in ({"tool": "../etc"}, {"tool": "x" * 500}, {}, {"tool": "clock", "more": 1}):
            refused = client.call("tools.schema", bad)
            assert not refused.ok and refused.error == control.INVALID_ARGS, bad
    finally:
        client.close()


def test_the_tools_call_example_of_the_cli_docs(clean_policy: DaemonProcess) -> None:
    """docs/cli.rst's `tools call clock` example is what the call prints (tests/console.py);
    the ``o`` after the question is what the person typed."""
    from tests.console import find, shown_lines_match

    block = find("cli.rst", "chalie tools call clock")
    out = clean_policy.cli_process(*block.commands[0].split()[1:], input="o\n")
    assert out.returncode == 0, out.stderr
    typed = [line.removesuffix(" o") if line.endswith("? o") else line for line in block.shown]
    block.shown = typed
    # The question waits on its line for the answer: the envelope may follow it there.
    shown_lines_match(block, out.stdout + out.stderr.replace("? ", "?\n"))


def test_tools_call_prompts_a_send_with_its_reach_first_and_only_the_given_params(
    clean_policy: DaemonProcess,
) -> None:
    # Issue 34: the prompt dumped all 25 email parameters, nulls included, and no reach.
    out = clean_policy.cli_process(
        "tools",
        "call",
        "email",
        "action=send",
        'to=["ann@example.com"]',
        "subject=Hi",
        "body=see you",
        input="d\n",
    )
    assert out.returncode == 1 and "code=permission-denied" in out.stdout
    lines = out.stderr.splitlines()
    assert lines[:2] == [
        "permission requested: email.send on chat",
        "  This reaches beyond Chalie: sends mail to ann@example.com; subject 'Hi'; body 'see you'",
    ]
    (params,) = [line for line in lines if line.startswith("  params ")]
    assert json.loads(params.removeprefix("  params ")) == {
        "action": "send",
        "body": "see you",
        "subject": "Hi",
        "to": ["ann@example.com"],
    }


def test_a_phone_number_for_a_nullable_string_parameter_reaches_the_tool_as_text(
    live: DaemonProcess,
) -> None:
    # Issue 34: `query=2123` was refused ("2123 is not valid under any of the given schemas").
    assert live.cli("policy", "set", "chat", "contacts", "allow").returncode == 0
    out = live.cli_process("tools", "call", "contacts", "action=search", "query=2123")
    assert "not valid under any" not in out.stdout + out.stderr
    assert "code=unknown-account" in out.stdout.splitlines()[0]  # it ran: no address book here
    rows = live.cli_process("trail", "--json").stdout
    searched = [r for r in json.loads(rows) if r["tool"] == "contacts"]
    assert json.loads(searched[0]["params"])["query"] == "2123"


def test_a_string_parameter_given_digits_reaches_the_tool_as_a_string(
    live: DaemonProcess,
) -> None:
    assert live.cli("policy", "set", "chat", "calculator", "allow").returncode == 0
    out = live.cli_process("tools", "call", "calculator", "expression=42")
    assert out.returncode == 0, out.stderr
    body = json.loads("\n".join(out.stdout.strip().splitlines()[1:-1]))
    assert body == {"expression": "42", "result": "42"}
    big = live.cli_process("tools", "call", "calculator", "expression=99999999999999999999")
    assert big.returncode == 0, big.stderr
    deep = live.cli_process("tools", "call", "echo_tool", "x=" + "[" * 5000 + "]" * 5000)
    assert deep.returncode == 2 and "Traceback" not in deep.stderr
    assert len(deep.stderr.strip().splitlines()) <= 4  # click's usage error, no traceback
    zero = live.cli_process("tools", "call", "calculator", "expression=0**-1")
    assert zero.returncode == 1 and "invalid-param" in zero.stdout


def test_trail_lists_calls_newest_first_and_filters(clean_policy: DaemonProcess) -> None:
    d = clean_policy
    assert d.cli("policy", "set", "chat", "echo_tool", "allow").returncode == 0
    conv = f"conv-{time.monotonic_ns()}"
    for i in range(3):
        assert d.cli("tools", "call", "echo_tool", f"i={i}", "--conversation", conv).returncode == 0
    assert d.cli("tools", "call", "no_such_tool", "--conversation", conv).returncode == 1
    rows = json.loads(d.cli("trail", "--conversation", conv, "--json").stdout)
    assert [r["tool"] for r in rows] == ["no_such_tool", "echo_tool", "echo_tool", "echo_tool"]
    assert [json.loads(r["params"]).get("i") for r in rows[1:]] == [2, 1, 0]
    assert all(r["channel"] == "chat" for r in rows)
    assert rows[1]["decision"] == "allow" and rows[1]["status"] == "success"
    only_errors = json.loads(
        d.cli("trail", "--conversation", conv, "--status", "error", "--json").stdout
    )
    assert [r["tool"] for r in only_errors] == ["no_such_tool"]
    assert (
        len(json.loads(d.cli("trail", "--tool", "echo_tool", "--limit", "2", "--json").stdout)) == 2
    )
    text = d.cli("trail", "--conversation", conv, "--limit", "1")
    assert text.returncode == 0 and "no_such_tool" in text.stdout and "unknown-tool" in text.stdout
    assert d.cli("trail", "--status", "bogus").returncode == 2
    assert d.cli("trail", "--limit", "0").returncode == 2


def test_trail_shows_what_the_dispatcher_healed(clean_policy: DaemonProcess) -> None:
    d = clean_policy
    assert d.cli("policy", "set", "chat", "calculator", "allow").returncode == 0
    conv = f"conv-{time.monotonic_ns()}"
    done = d.cli("tools", "call", "calculator", "expr=6*7", "--conversation", conv)
    assert done.returncode == 0 and "42" in done.stdout
    (row,) = json.loads(d.cli("trail", "--conversation", conv, "--json").stdout)
    assert row["healed"] == "parameter 'expr' was read as 'expression'"
    text = d.cli("trail", "--conversation", conv).stdout
    assert "healed parameter 'expr' was read as 'expression'" in text


def test_garbage_on_the_live_control_socket_gets_an_error_and_the_daemon_keeps_serving(
    live: DaemonProcess,
) -> None:
    ctx = zmq.Context.instance()
    for frames in (
        [b"\xde\xad\xbe\xef"],
        [b"x" * (control.MAX_REQUEST_BYTES + 1)],
        [b"", b"a", b"b"],
    ):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)
        sock.connect(control.endpoint(live.home))
        sock.send_multipart(frames)
        reply = control.decode_reply(sock.recv_multipart()[-1])
        sock.close()
        assert reply.ok is False and reply.error in (control.MALFORMED, control.OVERSIZED)
    bad_args = control.request(live.home, "tools.call", {"tool": "x", "evil": 1})
    assert (bad_args.ok, bad_args.error) == (False, control.INVALID_ARGS)
    assert live.cli("status").returncode == 0


def wait_for_running(d: DaemonProcess, tool: str) -> dict[str, object]:
    rows: list[dict[str, object]] = []

    def running() -> bool:
        rows[:] = json.loads(d.cli("trail", "--status", "running", "--tool", tool, "--json").stdout)
        return bool(rows)

    wait_until(running, 30, what=f"a running {tool} call on the trail")
    return rows[0]


def test_ctrl_c_in_tools_call_cancels_the_call_in_the_daemon(clean_policy: DaemonProcess) -> None:
    d = clean_policy
    assert d.cli("policy", "set", "chat", "slow_tool", "allow").returncode == 0
    caller = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chalie",
            "--home",
            str(d.home),
            "tools",
            "call",
            "slow_tool",
            "--conversation",
            "ctrl-c",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        row = wait_for_running(d, "slow_tool")
        assert signal_state(caller.pid, signal.SIGINT) == "caught"
        caller.send_signal(signal.SIGINT)
        _, err = caller.communicate(timeout=30)
    finally:
        reap(caller)
    assert caller.returncode == 130
    assert f"call {row['call_id']} cancelled" in err
    ended = json.loads(d.cli("trail", "--conversation", "ctrl-c", "--json").stdout)[0]
    assert (ended["status"], ended["code"]) == ("error", "cancelled")


def test_sigterm_with_a_stuck_call_in_flight_still_exits_cleanly(tmp_path: Path) -> None:
    home = make_home()
    d = DaemonProcess(home, tmp_path / "daemon.log")
    try:
        d.start()
        assert d.cli("policy", "set", "chat", "slow_tool", "allow").returncode == 0
        started = control.request(
            home, "tools.call", {"tool": "slow_tool", "arguments": {"act_summary": "stuck"}}
        )
        assert started.ok
        wait_for_running(d, "slow_tool")
        below = descendants(d.pid)
        began = time.monotonic()
        assert d.signal(signal.SIGTERM, timeout=30) == 0
        # The ability sleeps 60 s and ignores cancellation; the daemon does not wait for it.
        assert time.monotonic() - began < 20
        wait_until(lambda: not any(alive(p) for p in below), 5, what="no process left")
        d.start()
        rows = json.loads(d.cli("trail", "--tool", "slow_tool", "--json").stdout)
        assert rows[0]["status"] != "running"
        assert d.signal(signal.SIGTERM) == 0
    finally:
        d.kill()
        shutil.rmtree(home, ignore_errors=True)


# -- crashes -------------------------------------------------------------------------------------


def test_sigkill_loses_no_recorded_call_and_a_call_in_flight_is_marked_interrupted(
    tmp_path: Path,
) -> None:
    home = make_home()
    first = DaemonProcess(home, tmp_path / "first.log")
    second = DaemonProcess(home, tmp_path / "second.log")
    try:
        first.start()
        assert first.cli("policy", "set", "chat", "echo_tool", "allow").returncode == 0
        assert first.cli("policy", "set", "chat", "slow_tool", "allow").returncode == 0
        done = first.cli("tools", "call", "echo_tool", "n=1", "--conversation", "before-crash")
        assert done.returncode == 0
        slow = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chalie",
                "--home",
                str(home),
                "tools",
                "call",
                "slow_tool",
                "--conversation",
                "in-flight",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        running = wait_for_running(first, "slow_tool")
        assert running["tool"] == "slow_tool"
        first.kill()  # SIGKILL, mid-call
        slow.communicate(timeout=30)
        assert slow.returncode != 0  # the CLI learns its daemon is gone
        second.start()
        rows = json.loads(second.cli("trail", "--json").stdout)
        by_conv = {r["conversation_id"]: r for r in rows}
        assert by_conv["before-crash"]["status"] == "success"
        assert by_conv["before-crash"]["tool"] == "echo_tool"
        assert by_conv["in-flight"]["status"] == "interrupted"
        assert by_conv["in-flight"]["code"] == "interrupted"
        shown = second.cli("trail", "--status", "interrupted")
        assert "slow_tool" in shown.stdout and "interrupted" in shown.stdout
        # Its duration is unknown (the restart is not when it stopped), so none is shown.
        row_line = next(line for line in shown.stdout.splitlines() if "slow_tool" in line)
        assert row_line.split("  gate ")[0].split()[-1] == "-"
        assert second.signal(signal.SIGTERM) == 0
    finally:
        first.kill()
        second.kill()
        shutil.rmtree(home, ignore_errors=True)


def test_a_rejected_policy_set_is_one_line_and_logs_no_traceback(
    clean_policy: DaemonProcess,
) -> None:
    d = clean_policy
    before = len(d.log_lines())
    out = d.cli("policy", "set", "chat", "Bad Name!", "allow")
    assert out.returncode == 1
    assert out.stderr.startswith("chalie: invalid-args: invalid permission")
    assert len(out.stderr.strip().splitlines()) == 1
    assert d.cli("status").returncode == 0  # orders the log after the rejected request
    logged = json.dumps(d.log_lines()[before:])
    assert "PolicyError" not in logged and "Traceback" not in logged


def test_trail_filters_by_the_word_cancelled(tmp_path: Path) -> None:
    from chalie.wire.messages import TRAIL_FILTERS

    assert TRAIL_FILTERS["cancelled"] == ("error", "cancelled")
    result = CliRunner().invoke(
        cli, ["--home", str(tmp_path / "h"), "trail", "--status", "cancelled"]
    )
    assert "Invalid value" not in result.output and "no daemon running" in result.stderr


@pytest.mark.parametrize("damage", ["corrupt", "empty", "not-sqlite-header"])
@pytest.mark.parametrize("command", [["token", "list"], ["token", "create", "y"], ["run"]])
def test_an_unusable_database_is_one_line_and_exit_1_and_never_reinitialised(
    tmp_path: Path, damage: str, command: list[str]
) -> None:
    import subprocess
    import sys

    from chalie.gate.tokens import TokenStore

    with TokenStore(tmp_path / "chalie.db") as store:
        store.create("keep", scope="owner")
    db = tmp_path / "chalie.db"
    for extra in ("chalie.db-wal", "chalie.db-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    if damage == "corrupt":
        db.write_bytes(db.read_bytes()[:16] + b"\xff" * 8000)
    elif damage == "empty":
        db.write_bytes(b"")
    else:
        db.write_bytes(b"this is a text file, not a database\n")
    before = db.read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "chalie", "--home", str(tmp_path), *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "chalie.db" in lines[0] and "Traceback" not in done.stderr
    assert db.read_bytes() == before  # nothing re-created, nothing lost
