"""A whole daemon in-process (real actors, SQLite, workers) with a scripted model on loopback."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors.child_ref import ChildUnavailable
from actors.mcp.server import McpServerActor
from chalie.process.config import Config
from chalie_app import root
from chalie_app.root import Runtime
from tests.slow import require_slow
from tools.fake_llm.script import Script
from tools.fake_llm.server import FakeModelServer
from tools.waiting import wait_until


@contextlib.contextmanager
def live_daemon(script: Script, extra_toml: str = "") -> Iterator[tuple[Runtime, str]]:
    require_slow("a daemon")
    """Start the daemon on a fresh home against ``script``; yield its runtime and MCP URL."""
    home = Path(tempfile.mkdtemp(prefix="chm-", dir="/tmp"))
    model = FakeModelServer(script).start()
    (home / "config.toml").write_text(
        "workers = 1\n"
        "[mcp_server]\nport = 0\n"
        f"{extra_toml}\n"
        "[models.default]\n"
        f'provider = "openai"\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
        "stream = true\nretries = 0\n"
    )
    config = Config.load(home)
    ready: list[Runtime] = []
    result: list[int] = []

    def run() -> None:
        result.append(root.run(config, ready=ready.append))

    thread = threading.Thread(target=run, name="daemon-under-test", daemon=True)
    thread.start()
    try:
        wait_until(lambda: bool(ready) or bool(result), timeout=60)
        assert ready, f"the daemon did not start (exit {result})"
        rt = ready[0]

        def url() -> Any:
            try:
                server = rt.child("mcp_server", McpServerActor)
                return server.call(McpServerActor.status).get("url")
            except ChildUnavailable:
                return None  # the tree is still starting

        wait_until(lambda: bool(url()), timeout=30)
        # A find during the first index build is answered at once (discovery-index-building):
        # the exchange starts once the index is built.
        discovery = rt.services.discovery
        if discovery is not None:
            wait_until(
                lambda: discovery.snapshot()["state"] not in ("loading", "rebuilding"),
                timeout=120,
                what="the discovery index",
            )
        yield rt, str(url())
    finally:
        if ready:
            ready[0].request_stop()
        thread.join(60)
        model.stop()
        shutil.rmtree(home, ignore_errors=True)
