"""A control command imports only what it needs: never the mcp SDK, numpy, the abilities...

An operator runs ``chalie status`` all day and scripts run it in loops; every heavy
package on its path costs tens to hundreds of milliseconds a run. These tests run each
command in a fresh interpreter, exactly as the console script does, and read which
modules it loaded (``sys.modules`` at exit) instead of timing it.
``tests/app/test_cli.py`` runs the same check against a live daemon, where the
commands go all the way through their replies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[3]

# What no control command may load: each is slow to import and needed only by the
# daemon, a model, an index, a remote connection or an ability.
HEAVY: Final = (
    "mcp",
    "mcp_types",
    "pydantic",
    "starlette",
    "httpx",
    "httpx2",
    "numpy",
    "onnxruntime",
    "tokenizers",
    "usearch",
    "tantivy",
    "icalendar",
    "jsonschema",
    "pykka",
    "asyncio",
    "actors",
    "abilities",
    "chalie_app.root",
    "chalie.calls.registry",
    "chalie.ability",
)
# Commands that only talk to the daemon read no configuration file either.
NO_CONFIG: Final = ("chalie.process.config", "tomllib", "sqlite3")

# (argv, what it must not load beyond HEAVY)
CONTROL_COMMANDS: Final = [
    (["status"], NO_CONFIG),
    (["stop"], NO_CONFIG),
    (["policy", "list"], NO_CONFIG),
    (["trail"], NO_CONFIG),
    (["conversations", "list"], NO_CONFIG),
    (["tools", "call", "clock", "action=now"], NO_CONFIG),
    (["token", "list"], ("chalie.process.config",)),
    (["mcp", "list"], ("chalie.process.config",)),
]

# The command leaves through its exit handlers (chalie.process.quick_exit): the last one records.
PROBE: Final = """
import atexit, json, sys
out, argv = sys.argv[1], sys.argv[2:]
sys.argv = ["chalie", *argv]


def record():
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)


atexit.register(record)
from chalie_app.cli import main

main()
"""


def loaded_by(argv: list[str], home: Path, out: Path) -> set[str]:
    """The modules ``chalie --home HOME ARGV`` has loaded when it exits."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHALIE_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-c", PROBE, str(out), "--home", str(home), *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    names: list[str] = json.loads(out.read_text())
    return set(names)


def offending(modules: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == b or m.startswith(b + ".") for b in banned))


def check(argv: list[str], extra: tuple[str, ...], home: Path, out: Path) -> None:
    modules = loaded_by(argv, home, out)
    assert "chalie_app.cli" in modules  # the probe ran the command
    bad = offending(modules, (*HEAVY, *extra))
    assert not bad, f"`chalie {' '.join(argv)}` loads {bad[:12]}"


@pytest.mark.parametrize(("argv", "extra"), CONTROL_COMMANDS, ids=lambda a: " ".join(a))
def test_a_control_command_without_a_daemon_loads_nothing_heavy(
    argv: list[str], extra: tuple[str, ...], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    check(argv, extra, home, tmp_path / "modules.json")


def test_the_probe_sees_what_a_command_loads(tmp_path: Path) -> None:
    """The check can fail: a module the command does load is reported, banned or not."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    modules = loaded_by(["mcp", "list"], home, tmp_path / "modules.json")
    assert {"chalie.mcp.store", "sqlite3"} <= set(offending(modules, ("chalie.mcp", "sqlite3")))


__all__ = ["CONTROL_COMMANDS", "check"]
