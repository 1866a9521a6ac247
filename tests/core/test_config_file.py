"""config.toml edited in place: keys of one section set, the rest of the file untouched."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from chalie.process.config import ConfigError
from chalie.process.config_file import change, with_keys

TEXT = """# my settings
[chat]
port = 0   # any

[mcp_server]
# where agents connect
port = 8462
host = "127.0.0.1"

[discovery]
learn = true
"""


def test_keys_are_replaced_in_their_section_and_comments_stay() -> None:
    out = with_keys(TEXT, "mcp_server", {"port": 9000, "gateway": True})
    parsed = tomllib.loads(out)
    assert parsed["mcp_server"] == {"port": 9000, "host": "127.0.0.1", "gateway": True}
    assert parsed["chat"] == {"port": 0} and parsed["discovery"] == {"learn": True}
    assert "# my settings" in out and "# where agents connect" in out and "port = 0   # any" in out
    assert out.index("gateway = true") < out.index("[discovery]")


def test_a_missing_section_is_added_and_strings_are_quoted() -> None:
    out = with_keys("[chat]\nport = 0\n", "mcp_server", {"host": 'a"b\\c', "enabled": False})
    assert tomllib.loads(out)["mcp_server"] == {"host": 'a"b\\c', "enabled": False}


def test_an_invalid_result_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(TEXT)
    with pytest.raises(ConfigError):
        change(tmp_path, "mcp_server", {"port": 70000})

    def refuse(_config: object) -> None:
        raise ConfigError("no")

    with pytest.raises(ConfigError):
        change(tmp_path, "mcp_server", {"port": 9001}, check=refuse)
    assert (tmp_path / "config.toml").read_text() == TEXT
    config = change(tmp_path, "mcp_server", {"port": 9002})
    assert config.mcp_server.port == 9002
    assert (tmp_path / "config.toml").stat().st_mode & 0o777 == 0o600
