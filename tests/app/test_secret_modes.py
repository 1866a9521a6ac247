"""Secret files another local user could read (issue 30, medium): a data directory restored
with ``first-token`` and ``mcp-secrets.json`` at 0644 in a 0755 home let ``nobody`` read the
owner token. At start every secret file is made 0600 and each loose one is reported, and a
home others can read is warned about. A real daemon process and a real second OS user."""

from __future__ import annotations

import os

import pytest

from tests.daemon_process import DaemonProcess, short_home
from tests.other_user import other_user, run_as

pytestmark = pytest.mark.slow


def test_loose_secret_files_are_made_private_at_start_and_reported() -> None:
    probe = other_user()
    home = short_home()
    os.chmod(home, 0o755)  # restored from a backup: others may enter and read
    token = home / "first-token"
    token.write_text("chalie_secret_owner_token\n")
    secrets = home / "mcp-secrets.json"
    secrets.write_text('{"s1": "hunter2"}')
    for path in (token, secrets):
        os.chmod(path, 0o644)
    before = run_as(probe, ["/bin/cat", str(token)])
    assert before.returncode == 0 and "chalie_secret" in before.stdout  # the hole, as found

    d = DaemonProcess(home, home / "daemon.log").start()
    try:
        for path in (token, secrets, home / "chalie.db"):
            assert path.stat().st_mode & 0o777 == 0o600, path
            seen = run_as(probe, ["/bin/cat", str(path)])
            assert seen.returncode != 0 and "secret" not in seen.stdout, path
        lines = d.log_lines()
        made = {str(line.get("path")) for line in lines if "made 0600" in str(line.get("msg"))}
        assert {str(token), str(secrets)} <= made, lines
        assert any("other users can read or enter" in str(line.get("msg")) for line in lines)
    finally:
        d.kill()
