"""A process that leaves by quick_exit keeps what a normal exit promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from chalie.process.quick_exit import exit_code

ROOT: Final = Path(__file__).resolve().parents[2]
ENV: Final = {**os.environ, "PYTHONPATH": str(ROOT)}

LEAVER: Final = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from chalie.process.quick_exit import quick_exit

atexit.register(lambda: print("handler ran", file=sys.stderr))
sys.stdout.write("buffered, no newline")  # still in the buffer at the exit
done = []
worker = threading.Thread(target=lambda: (time.sleep(0.05), done.append("thread")))
worker.start()
pool = ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.05), print("queued work done", file=sys.stderr)))
atexit.register(lambda: print("joined:", done, file=sys.stderr))
quick_exit(3)
print("never", file=sys.stderr)
"""


def test_handlers_run_streams_are_flushed_threads_finish_and_the_code_is_kept() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LEAVER], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3
    assert done.stdout == "buffered, no newline"
    lines = done.stderr.splitlines()
    assert lines == ["queued work done", "joined: ['thread']", "handler ran"]


@pytest.mark.parametrize(
    ("code", "expected", "printed"), [(None, 0, ""), (0, 0, ""), (5, 5, ""), ("bad", 1, "bad\n")]
)
def test_a_system_exit_code_means_what_it_means_to_python(
    code: object, expected: int, printed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(code) == expected
    assert capsys.readouterr().err == printed


def test_the_chalie_command_leaves_with_its_output_and_its_code(tmp_path: Path) -> None:
    chalie = [sys.executable, "-m", "chalie", "--home", str(tmp_path)]
    version = subprocess.run(
        [*chalie, "--version"], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0 and version.stdout.startswith("chalie")
    wrong = subprocess.run(
        [*chalie, "no-such-command"], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert wrong.returncode == 2 and "No such command" in wrong.stderr
    nothing = subprocess.run([*chalie, "stop"], env=ENV, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 0 and "nothing to stop" in nothing.stdout
