"""``chalie tools list`` with no daemon imports every ability, and must stay a quick command
(issue 34: it took 1.6 s, importing the MCP SDK and the memory index): an ability imports
what its run needs inside the run, and a schema msgspec derived is not re-checked.

The figure itself is tools/bench/bench_cli.py's ``tools list (no daemon)`` row."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jsonschema

from chalie.calls.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
# Libraries whose import alone costs tens to hundreds of milliseconds: none is needed to
# list the tools (each is imported by the run that uses it).
HEAVY = (
    "mcp",
    "mcp_types",
    "pydantic",
    "starlette",
    "uvicorn",
    "httpx2",
    "httpcore2",
    "numpy",
    "onnxruntime",
    "usearch",
    "icalendar",
    "vobject",
    "imapclient",
    "jsonschema",
)


def test_tools_list_without_a_daemon_imports_no_heavy_library(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "chalie",
            "--home",
            str(tmp_path),
            "tools",
            "list",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    assert "find_tools" in done.stdout and "clock" in done.stdout  # it listed them
    imported = {
        m.group(1).split(".")[0]
        for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", done.stderr, re.M)
    }
    assert imported, done.stderr[-2000:]
    assert sorted(imported.intersection(HEAVY)) == []


def test_every_schema_msgspec_derived_is_valid_json_schema() -> None:
    # The load-time meta-schema check is skipped for these: this is the check, once, here.
    registry = Registry.collect()
    assert len(registry) >= 15
    for entry in registry:
        jsonschema.Draft202012Validator.check_schema(dict(entry.cls.parameters))
