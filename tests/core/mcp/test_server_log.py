"""A stdio server's stderr is bounded and rotated, and its log leaves with the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from chalie.mcp import server_log
from chalie.mcp.server_log import ServerLog, log_path

SPAM = "import sys\nfor _ in range(320):\n    sys.stderr.write('x' * 65535 + '\\n')\n"


def test_a_server_printing_20_mb_to_stderr_leaves_at_most_two_bounded_files(
    tmp_path: Path,
) -> None:
    path = log_path(tmp_path / "logs", "noisy")
    log = ServerLog(path, max_bytes=256 * 1024)
    child = subprocess.Popen([sys.executable, "-c", SPAM], stderr=log)  # type: ignore[call-overload]
    assert child.wait(60) == 0
    log.write("a log notification after it\n")
    log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["mcp-noisy.log", "mcp-noisy.log.1"]
    assert all(p.stat().st_size <= 256 * 1024 for p in path.parent.iterdir())
    assert log.rotations >= 70  # 20 MB went through, 512 KiB stayed
    assert path.read_text().endswith("a log notification after it\n")


def test_removing_the_server_removes_its_log_and_backup(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("mcp-a.log", "mcp-a.log.1", "mcp-b.log"):
        (logs / name).write_text("x")
    assert server_log.remove(logs, "a") == 2
    assert sorted(p.name for p in logs.iterdir()) == ["mcp-b.log"]


def test_admin_remove_takes_the_log_away(tmp_path: Path) -> None:
    from chalie.mcp.admin import McpAdmin
    from chalie.mcp.spec import ServerSpec

    admin = McpAdmin(tmp_path / "chalie.db", tmp_path)
    try:
        admin.add(ServerSpec(name="gone", transport="stdio", command="true"))
        (tmp_path / "logs").mkdir()
        log_path(tmp_path / "logs", "gone").write_text("old output")
        assert admin.remove("gone")["removed_logs"] == 1
        assert not log_path(tmp_path / "logs", "gone").exists()
    finally:
        admin.close()
