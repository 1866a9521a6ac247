"""The console examples of docs/, found, and run as a person pastes them.

A console example is a ``.. code-block:: console`` block; its ``$`` lines are commands (a
heredoc's body and end marker belong to the command), the other lines what the commands
print, where ``...`` stands for any text. Just above each block an rst comment says what
it is:

- ``.. console: runs``: tests/test_docs_console.py runs its commands in order, in one
  ``bash`` with ``set -e``, on a fresh data directory and a fresh ``HOME``, with a
  ``chalie`` on ``PATH`` that is this checkout's CLI, and finds each shown line in the
  output;
- ``.. console: checked by tests/FILE.py::TEST``: that test runs it against what it
  needs (a daemon, a person at the prompt) with :func:`shown_lines_match`;
- ``.. console: illustration: WHY``: not run, and WHY says why not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARK = re.compile(r"^\s*\.\. console: (runs|checked by (\S+)|illustration: (.+))$")


@dataclass
class Block:
    path: Path
    line: int  # of the code-block directive, 1-based
    mark: str  # "runs", "checked", "illustration", or "" (none)
    detail: str  # the test (checked) or the reason (illustration)
    commands: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    end: int = 0  # the last line of its body, 1-based

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The console blocks of one rst file, in order."""
    lines = path.read_text().splitlines()
    found = []
    for i, text in enumerate(lines):
        if text.strip() != ".. code-block:: console":
            continue
        indent = len(text) - len(text.lstrip())
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        m = MARK.match(lines[j]) if j >= 0 else None
        if m is None:
            block = Block(path, i + 1, "", "")
        elif m.group(1) == "runs":
            block = Block(path, i + 1, "runs", "")
        elif m.group(2):
            block = Block(path, i + 1, "checked", m.group(2))
        else:
            block = Block(path, i + 1, "illustration", m.group(3).strip())
        body = []
        k = i + 1
        while k < len(lines) and (not lines[k].strip() or _indent(lines[k]) > indent):
            body.append(lines[k])
            k += 1
        _split(block, body)
        block.end = k
        found.append(block)
    return found


def all_blocks() -> list[Block]:
    return [b for path in sorted(DOCS.glob("*.rst")) for b in blocks(path)]


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _split(block: Block, body: list[str]) -> None:
    texts = [b for b in body if b.strip()]
    cut = min((_indent(b) for b in texts), default=0)
    heredoc: str | None = None
    for raw in body:
        text = raw[cut:] if raw.strip() else ""
        if heredoc is not None:
            block.commands[-1] += "\n" + text
            if text.strip() == heredoc:
                heredoc = None
            continue
        if text.startswith("$ "):
            command = text[2:]
            block.commands.append(command)
            m = re.search(r"<<-?\s*'?\"?([A-Za-z_]+)'?\"?", command)
            heredoc = m.group(1) if m else None
        elif text.strip():
            block.shown.append(text.rstrip())


def pattern(shown: str) -> re.Pattern[str]:
    """A shown line as a pattern for one line of output: ``...`` is any text."""
    return re.compile(".*".join(re.escape(part) for part in shown.strip().split("...")))


def missing(shown: list[str], output: str) -> list[str]:
    """The shown lines no line of ``output`` is (``...`` matching anything)."""
    outputs = [line.strip() for line in output.splitlines()]
    return [s for s in shown if not any(pattern(s).fullmatch(o) for o in outputs)]


def shown_lines_match(block: Block, output: str) -> None:
    gone = missing(block.shown, output)
    assert not gone, f"{block.where} shows lines the run did not print: {gone}\n{output}"


def find(name: str, first_command: str) -> Block:
    """The console block of docs/NAME whose first command starts with ``first_command``."""
    for block in blocks(DOCS / name):
        if block.commands and block.commands[0].startswith(first_command):
            return block
    raise AssertionError(f"no console block in docs/{name} starts with {first_command!r}")


def chalie_on_path(scratch: Path) -> Path:
    """A ``bin`` folder in ``scratch`` holding a ``chalie`` that does what the installed
    console script does (``chalie = chalie_app.cli:main``), on this checkout's code."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "chalie"
    shim.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        '\'import sys; sys.argv[0] = "chalie"; from chalie_app.cli import main; main()\' "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


def run(block: Block, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The block's commands in one bash, as a person on a fresh machine pastes them.

    ``CHALIE_HOME`` is a fresh data directory whose config.toml takes any free ports (a
    test machine's may be taken); nothing is left running (the trap stops a daemon and
    a scripted model the block started)."""
    with tempfile.TemporaryDirectory(prefix="chx-", dir="/tmp") as scratch:
        bin_dir = chalie_on_path(Path(scratch))
        home = Path(scratch) / "home"
        home.mkdir()
        (home / "config.toml").write_text("[chat]\nport = 0\n[mcp_server]\nport = 0\n")
        cleanup = (
            'trap \'chalie stop >/dev/null 2>&1; [ -f "$CHALIE_HOME/model.pid" ] && '
            'kill "$(cat "$CHALIE_HOME/model.pid")" 2>/dev/null; true\' EXIT'
        )
        script = "\n".join(["set -e", cleanup, *block.commands]) + "\n"
        env = {
            **{k: v for k, v in os.environ.items() if k != "CHALIE_HOME"},
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
            "HOME": scratch,
            "CHALIE_HOME": str(home),
        }
        return subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
