"""``chalie brain open`` as another local user sees it (issue 30, high): the one-time sign-in
secret is on no command line and in no file that user reads; the real browser still signs in
from the page it is given; ``chalie brain sign-out`` ends that session (no token backs it).

A real daemon, the real CLI as its own process, a stand-in browser that holds still while a
real second OS user (``useradd``) reads every process's ``/proc/*/cmdline``, then Debian's
Chromium (Playwright) opening the page the CLI gave it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import pytest
from playwright.sync_api import Browser

from tests.core.brain.daemon import BrainDaemon
from tests.other_user import other_user, run_as
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

# What another user can see of every running process: whether the secret (given on stdin, so
# that it is on no command line of the probe's own) is on its command line; and whether the
# files named there can be read.
PROBE = r"""
import json, os, sys
secret = sys.stdin.read().strip()
assert len(secret) >= 16, "no secret to look for"
seen, readable = [], []
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        continue
    if any(secret in a for a in argv):
        seen.append(argv)
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            readable.append((path, f.read()[:200].decode("utf-8", "replace")))
    except OSError:
        pass
print(json.dumps({"seen": seen, "readable": readable}))
"""

# A browser that records how it was started and holds still until told to go.
BROWSER = """#!{python}
import json, os, sys, time
with open({argv_file!r} + ".tmp", "w") as f:
    json.dump(sys.argv[1:], f)
os.replace({argv_file!r} + ".tmp", {argv_file!r})
deadline = time.monotonic() + 60
while not os.path.exists({go_file!r}) and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def test_the_sign_in_secret_is_on_no_command_line_and_its_session_can_be_ended(
    d: BrainDaemon, browser: Browser, tmp_path: Path
) -> None:
    probe_user = other_user()
    argv_file, go_file = tmp_path / "argv.json", tmp_path / "go"
    fake = tmp_path / "browser"
    fake.write_text(
        BROWSER.format(python=sys.executable, argv_file=str(argv_file), go_file=str(go_file))
    )
    fake.chmod(0o700)
    env = {**os.environ, "BROWSER": str(fake), "CHALIE_HOME": str(d.home)}
    cli = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(d.home), "brain", "open"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(argv_file.exists, timeout=60, what="the browser to be started")
        (opened,) = json.loads(argv_file.read_text())
        # The link was printed before the browser was started.
        assert cli.stdout is not None
        link = cli.stdout.readline().strip()
        (secret,) = parse_qs(urlparse(link).query)["code"]
        # While the browser runs, another local user looks for the secret on every command
        # line and tries every file named there.
        named = [unquote(urlparse(opened).path)] if opened.startswith("file:") else []
        found = run_as(
            probe_user, ["/usr/bin/python3", "-c", PROBE, *named], input=secret, timeout=60
        )
        assert found.returncode == 0, found.stderr
        looked = json.loads(found.stdout)
        assert looked == {"seen": [], "readable": []}, looked
    finally:
        go_file.touch()
        _, err = cli.communicate(timeout=60)
    assert cli.returncode == 0, err
    assert "/brain/link?code=" not in opened
    page_file = Path(unquote(urlparse(opened).path))
    assert page_file.stat().st_mode & 0o777 == 0o600

    # The owner's real browser, given the same page, ends up signed in.
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(opened)
        page.wait_for_url(f"{d.base}/brain/overview", timeout=20_000)
        assert page.locator("form[action='/brain/logout']").count() == 1
        # The link was spent by that browser: printed on the terminal, it no longer works.
        with d.client(None) as c:
            assert c.get(link[len(d.base) :]).status_code == 401

        # Its session has no token behind it; the operator ends it.
        ended = subprocess.run(
            [sys.executable, "-m", "chalie", "--home", str(d.home), "brain", "sign-out"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ended.returncode == 0 and "signed out 1 browser session" in ended.stdout, ended
        page.goto(f"{d.base}/brain/overview")
        assert page.url.startswith(f"{d.base}/brain/login")
    finally:
        context.close()
