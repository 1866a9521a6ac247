"""The README's first conversation works when its lines are run exactly as written."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.console import chalie_on_path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.rst"


def first_conversation() -> list[str]:
    text = README.read_text()
    block = text.split(".. first conversation: begin", 1)[1].split(".. first conversation: end")[0]
    return [line[len("   $ ") :] for line in block.splitlines() if line.startswith("   $ ")]


def test_the_readme_is_a_newcomers_page() -> None:
    assert 150 <= len(README.read_text().splitlines()) <= 200
    assert len(first_conversation()) >= 5


def test_the_console_script_is_the_cli_the_shim_below_runs() -> None:
    # The test puts a `chalie` on PATH that does what the installed console script does.
    assert "chalie = chalie_app.cli:main" in (ROOT / "setup.cfg").read_text()


@pytest.mark.slow
def test_the_first_conversation_works_pasted_line_by_line() -> None:
    lines = first_conversation()
    with tempfile.TemporaryDirectory(prefix="chr-", dir="/tmp") as scratch:
        bin_dir = chalie_on_path(Path(scratch))
        # Whatever happens, nothing is left running: the daemon and the model are stopped.
        cleanup = (
            'trap \'chalie stop >/dev/null 2>&1; [ -f "$CHALIE_HOME/model.pid" ] && '
            'kill "$(cat "$CHALIE_HOME/model.pid")" 2>/dev/null; true\' EXIT'
        )
        script = "\n".join(["set -e", lines[0], cleanup, *lines[1:]]) + "\n"
        env = {
            **{k: v for k, v in os.environ.items() if k != "CHALIE_HOME"},
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
            "HOME": scratch,  # a fresh machine: no user data directory yet
        }
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    assert "You said: hello there" in out
    # `chalie run` said, on the terminal, where things are and that the model answers.
    assert re.search(r"chalie: daemon \d+ on /tmp/", out)
    assert re.search(
        r"model default: scripted at http://127\.0\.0\.1:\d+/v1 \(openai\): answers", out
    )
    assert re.search(r"scripted model listening on http://127\.0\.0\.1:\d+", out)
    assert "daemon" in out and "stopped" in out
