"""The personal abilities in a real daemon: accounts added by the CLI, calls through the gate."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator

import pytest

from tests.daemon_process import DaemonProcess, short_home
from tests.personal import open_meteo
from tests.personal.test_calendar import WEEKLY_BERLIN
from tools.personal_servers import Http, Radicale, http_server, make_calendar, put_object, radicale

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DaemonProcess, Radicale, Http]]:
    with radicale() as dav, http_server(open_meteo.route) as meteo:
        make_calendar(dav, "alice", "work", "Work")
        put_object(dav, "alice", "/alice/work/weekly.ics", WEEKLY_BERLIN, "text/calendar")
        home = short_home()
        (home / "config.toml").write_text(
            "[mcp_server]\nport = 0\n[chat]\nport = 0\n"
            f'[weather]\nforecast_url = "{meteo.url}/v1/forecast"\n'
            f'geocoding_url = "{meteo.url}/v1/search"\n'
            '[accounts]\nzone = "Europe/Berlin"\n'
        )
        d = DaemonProcess(home, tmp_path_factory.mktemp("personal") / "daemon.log").start()
        try:
            yield d, dav, meteo
            assert d.signal(signal.SIGTERM) == 0
        finally:
            d.kill()
            shutil.rmtree(home, ignore_errors=True)


def body(stdout: str, tool: str) -> dict[str, object]:
    lines = stdout.strip().splitlines()
    assert lines[0].startswith(f"[{tool}(status=success") and lines[-1] == f"[end:{tool}]", stdout
    content = [ln for ln in lines[1:-1] if not ln.startswith("UNTRUSTED CONTENT")]
    data: dict[str, object] = json.loads("\n".join(content))
    return data


def test_weather_through_the_daemon_has_the_seeds_envelope(
    stack: tuple[DaemonProcess, Radicale, Http],
) -> None:
    d, _, _ = stack
    out = d.cli("tools", "call", "weather", "place=Valletta", input="o\n")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[1] == (
        '{"location":"Valletta, MT","condition":"Clear","temperature_c":24.1,"temperature_f":75.4}'
    )


def test_calendar_reads_with_the_daemons_zone_and_writes_ask(
    stack: tuple[DaemonProcess, Radicale, Http],
) -> None:
    d, dav, _ = stack
    added = d.cli(
        "accounts",
        "add",
        "caldav",
        "work",
        "--url",
        dav.url + "/",
        "--username",
        "alice",
        "--password-stdin",
        input="secret\n",
    )
    assert added.returncode == 0, added.stdout
    listed = d.cli("tools", "call", "calendar", "start=2025-04-03", input="o\n")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "permission requested: calendar.list on chat" in listed.stderr
    events = body(listed.stdout, "calendar")["events"]
    assert [(e["title"], e["start"]) for e in events] == [("Standup", "2025-04-03T09:00+02:00")]  # type: ignore[index,union-attr]
    # a write is its own permission, unseen: it asks; nobody answering denies it
    gone = d.cli(
        "tools", "call", "calendar", "action=delete_event", "id=/alice/work/weekly.ics", input=""
    )
    assert gone.returncode == 1
    assert "permission requested: calendar.delete_event on chat" in gone.stderr
    assert "permission-denied" in gone.stdout.splitlines()[0]
    still = d.cli("tools", "call", "calendar", "start=2025-04-03", input="o\n")
    assert len(body(still.stdout, "calendar")["events"]) == 1  # type: ignore[arg-type]
    # the password never reached the log or the trail
    trail = d.cli("trail", "--json").stdout
    assert "secret" not in d.log() and "secret" not in trail


def test_an_unreachable_account_is_a_structured_error_through_the_daemon(
    stack: tuple[DaemonProcess, Radicale, Http],
) -> None:
    d, _, _ = stack
    d.cli("accounts", "add", "caldav", "dead", "--url", "http://127.0.0.1:9/", "--no-password")
    out = d.cli("tools", "call", "calendar", "account=dead", input="o\n")
    assert out.returncode == 1
    first = out.stdout.splitlines()[0]
    assert "code=account-unreachable" in first and "account=dead" in first
    assert "Traceback" not in out.stdout


def test_a_tool_level_allow_does_not_cover_a_delete(
    stack: tuple[DaemonProcess, Radicale, Http],
) -> None:
    """Issue 30: a tool-level allow of calendar covered calendar.delete_event, though a delete
    is sensitive. It asks still (nobody answering: denied), and the event is still there."""
    d, _, _ = stack
    assert d.cli("policy", "set", "chat", "calendar", "allow").returncode == 0
    try:
        listed = d.cli("tools", "call", "calendar", "start=2025-04-03", input="")
        assert len(body(listed.stdout, "calendar")["events"]) == 1  # type: ignore[arg-type]
        gone = d.cli(
            "tools",
            "call",
            "calendar",
            "action=delete_event",
            "id=/alice/work/weekly.ics",
            input="",
        )
        assert "permission requested: calendar.delete_event on chat" in gone.stderr, gone.stdout
        assert gone.returncode == 1 and "permission-denied" in gone.stdout.splitlines()[0]
        still = d.cli("tools", "call", "calendar", "start=2025-04-03", input="")
        assert len(body(still.stdout, "calendar")["events"]) == 1  # type: ignore[arg-type]
    finally:
        d.cli("policy", "reset", "--channel", "chat", "--permission", "calendar")
