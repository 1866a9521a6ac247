"""A stuck start-up step never makes the daemon unstoppable (issue 30, medium): the probe's
discovery actor spun inside OpenBLAS in its on_start, and ``chalie stop`` could not stop the
daemon (kill -9 did). A real daemon process with a child whose on_start never returns: a
SIGTERM still ends the process, with the stuck child named in the log."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess, short_home
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

STUCK_DAEMON = textwrap.dedent(
    """
    import sys, threading
    from actors.actor import SupervisedActor
    from chalie.process import daemon
    from chalie.process import logs
    from chalie.process.config import Config
    from chalie.process.supervision import ChildSpec
    from chalie_app import root

    class Stuck(SupervisedActor):
        def on_start(self):
            print("stuck child started", flush=True)
            threading.Event().wait()  # a start-up step that never returns

    logs.configure()
    spec = lambda rt: ChildSpec("stuck", Stuck.start, shutdown=1.0)
    daemon.exit_process(root.run(Config.load(sys.argv[1]), extra_children=[spec]))
    """
)


def test_a_child_stuck_in_its_start_does_not_keep_the_daemon_from_stopping(tmp_path: Path) -> None:
    home = short_home()
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_DAEMON)
    d = DaemonProcess(home, home / "daemon.log", argv=[sys.executable, str(script), str(home)])
    d.start(wait=False)
    try:
        wait_until(lambda: "stuck child started" in d.log(), 60, "the stuck child")
        wait_until(lambda: "daemon started" in d.log(), 60, "the daemon")
        code = d.signal(signal.SIGTERM, timeout=90)
        assert code == 0, d.log()[-2000:]
        assert "stuck" in d.log() and "did not stop" in d.log()
    finally:
        d.kill()
