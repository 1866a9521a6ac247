"""Reminders across two real daemons on one real PostgreSQL (issue 33 §1): each firing is
fired once, and one whose daemon is killed mid-turn is fired again by the other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm import FakeModelServer, load_script
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

ANSWER = {"text": "reminded: {last_user}"}


def pair_on(url: str, model: FakeModelServer) -> list[DaemonProcess]:
    daemons = []
    for _ in range(2):
        home = short_home()
        (home / "config.toml").write_text(
            f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
            f'[mcp_server]\nport = 0\n[chat]\nport = 0\n[store]\nurl = "{url}"\n'
        )
        daemons.append(DaemonProcess(home, home / "daemon.log").start())
    return daemons


@pytest.fixture
def database(pg_cluster: Any) -> str:
    url: str = pg_cluster.new_database()
    return url


def reminders(d: DaemonProcess) -> dict[str, dict[str, Any]]:
    done = d.cli_process("reminders", "list", "--all", "--json")
    assert done.returncode == 0, done.stderr
    return {r["text"]: r for r in json.loads(done.stdout)}


def reminder_turns(model: FakeModelServer, text: str) -> int:
    """How many model requests were a reminder turn's first step for ``text``."""
    count = 0
    for request in model.requests:
        messages = request["body"].get("messages") or []
        last = messages[-1] if messages else {}
        if last.get("role") == "user" and text in str(last.get("content")):
            count += 1
    return count


def fired_lines(d: DaemonProcess) -> int:
    return sum(1 for line in d.log_lines() if line.get("msg") == "reminder fired")


@pytest.fixture
def answering(database: str) -> Iterator[tuple[list[DaemonProcess], FakeModelServer]]:
    with FakeModelServer(load_script(json.dumps({"on_user": ANSWER}))) as model:
        daemons = pair_on(database, model)
        try:
            yield daemons, model
        finally:
            for d in daemons:
                d.kill()


def test_reminders_set_on_a_fire_once_across_both_daemons(
    answering: tuple[list[DaemonProcess], FakeModelServer],
) -> None:
    (a, b), model = answering
    texts = [f"stretch number {i}" for i in range(4)]
    for text in texts:
        assert a.cli_process("reminders", "add", text, "--after", "2s").returncode == 0
    # B hears of them (a notice, not its minute's look) and is armed for the same second.
    wait_until(lambda: len(reminders(b)) == 4, 10, "B lists A's reminders")

    def all_answered() -> bool:
        rows = reminders(b)
        return all((rows[t].get("last_answer") or "").startswith("reminded:") for t in texts)

    wait_until(all_answered, 60, "every reminder answered")
    rows = reminders(a)
    assert {t: (rows[t]["fired"], rows[t]["state"]) for t in texts} == {
        t: (1, "done") for t in texts
    }
    assert [reminder_turns(model, t) for t in texts] == [1, 1, 1, 1]
    assert fired_lines(a) + fired_lines(b) == 4


def test_a_reminder_whose_daemon_is_killed_mid_turn_is_fired_by_the_other(database: str) -> None:
    script = {"steps": [{"hang": True}], "on_user": ANSWER}  # the first turn never ends
    with FakeModelServer(load_script(json.dumps(script))) as model:
        daemons = pair_on(database, model)
        try:
            a, b = daemons
            assert a.cli_process("reminders", "add", "call mum", "--after", "2s").returncode == 0
            claimant = wait_until(
                lambda: next((d for d in daemons if fired_lines(d)), None), 30, "a firing"
            )
            wait_until(lambda: reminder_turns(model, "call mum") == 1, 30, "its turn's request")
            survivor = b if claimant is a else a
            claimant.kill()  # SIGKILL while its turn waits for the model

            def answered() -> bool:
                row = reminders(survivor)["call mum"]
                return (row.get("last_answer") or "").startswith("reminded:")

            wait_until(answered, 30, "the survivor fires it again and answers")
            row = reminders(survivor)["call mum"]
            assert (row["fired"], row["state"]) == (1, "done")  # one firing, taken over
            assert reminder_turns(model, "call mum") == 2
            assert fired_lines(survivor) == 1 and "fires again" in survivor.log()  # the take-over
        finally:
            for d in daemons:
                d.kill()
