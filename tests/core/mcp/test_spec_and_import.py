"""Connection specs, the mcpServers import and secrets: hostile input refused, secrets sealed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from chalie.mcp.admin import McpAdmin, McpAdminError
from chalie.mcp.importing import ImportFileError, parse_servers, spec_from_options
from chalie.mcp.secrets import MissingSecret, SecretFile, resolve, seal, shown
from chalie.mcp.spec import ServerSpec, SpecError, check_spec

CLAUDE = {
    "mcpServers": {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@x/server-fs", "/tmp"],
            "env": {"GITHUB_TOKEN": "ghp_secretvalue123", "LOG_LEVEL": "debug"},
        },
        "task-tracker": {
            "type": "http",
            "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer tok-abcdef-123456"},
        },
        "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
        "envref": {"url": "https://x.example/mcp", "headers": {"X-Key": "${API_KEY}"}},
        "broken": {"type": "carrier-pigeon"},
        "nocommand": {"args": ["x"]},
        "badurl": {"type": "http", "url": "file:///etc/passwd"},
        "inject": {"type": "http", "url": "https://x/mcp", "headers": {"X": "a\r\nHost: evil"}},
    }
}


def test_claude_desktop_file_imports_the_good_entries_and_names_the_bad() -> None:
    parsed = parse_servers(json.dumps(CLAUDE))
    names = {s.name: s for s in parsed.specs}
    assert set(names) == {"filesystem", "tasktracker", "legacy", "envref"}
    assert names["tasktracker"].transport == "http" and names["legacy"].transport == "sse"
    assert names["envref"].transport == "http"
    assert names["filesystem"].args == ("-y", "@x/server-fs", "/tmp")
    problems = " | ".join(parsed.problems)
    for bad in ("broken", "nocommand", "badurl", "inject"):
        assert bad in problems


def test_vscode_layouts_and_env_syntax_are_read() -> None:
    doc = {
        "servers": {
            "gh": {"type": "stdio", "command": "gh-mcp", "env": {"TOKEN": "${env:GH_TOKEN}"}}
        }
    }
    (spec,) = parse_servers(json.dumps(doc)).specs
    assert spec.env == {"TOKEN": "${GH_TOKEN}"}
    nested = {"mcp": {"servers": {"a": {"type": "streamable-http", "url": "http://h/mcp"}}}}
    assert parse_servers(json.dumps(nested)).specs[0].transport == "http"
    unsupported = {"servers": {"b": {"url": "http://h/mcp", "headers": {"K": "${input:key}"}}}}
    assert "unsupported reference" in parse_servers(json.dumps(unsupported)).problems[0]


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"other": 1}',
        '{"mcpServers": []}',
        "{" * 100_000,
        json.dumps({"mcpServers": {f"s{i}": {"command": "x"} for i in range(600)}}),
        "x" * (2 << 20),
    ],
)
def test_an_unusable_file_is_refused_whole_with_a_reason(text: str) -> None:
    with pytest.raises(ImportFileError):
        parse_servers(text)


def test_hostile_entries_are_refused_one_by_one() -> None:
    doc = {
        "mcpServers": {
            "huge": {"command": "x", "args": ["a" * 10_000]},
            "many": {"command": "x", "args": ["a"] * 1000},
            "nul": {"command": "x\x00y"},
            "types": {"command": ["x"]},
            "envname": {"command": "x", "env": {"1BAD": "v"}},
            "ok": {"command": "x"},
        }
    }
    parsed = parse_servers(json.dumps(doc))
    assert [s.name for s in parsed.specs] == ["ok"] and len(parsed.problems) == 5


def test_add_options_build_a_checked_spec() -> None:
    spec = spec_from_options("notes", url="https://n/mcp", headers=["Authorization: Bearer x"])
    assert spec.headers == {"Authorization": "Bearer x"}
    with pytest.raises(SpecError):
        spec_from_options("x", command="a", url="https://b")
    with pytest.raises(SpecError):
        spec_from_options("x")
    with pytest.raises(SpecError):
        spec_from_options("x", url="https://b", env=["A=1"])
    with pytest.raises(SpecError):
        check_spec(ServerSpec(name="x", transport="stdio", command="c", connect_timeout=-1))


def test_secrets_never_reach_the_database_and_are_never_shown(tmp_path: Path) -> None:
    admin = McpAdmin(tmp_path / "chalie.db", tmp_path)
    report = admin.import_text(json.dumps(CLAUDE))
    assert set(report["added"]) == {"filesystem", "tasktracker", "legacy", "envref"}
    admin.add(spec_from_options("q", url="https://u:pa55word@h.example/mcp?api_key=k3y-value&x=1"))
    admin.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("chalie.db*"))
    for secret in (b"ghp_secretvalue123", b"tok-abcdef-123456", b"pa55word", b"k3y-value"):
        assert secret not in raw
    assert b"debug" in raw  # an ordinary env value stays readable
    secrets = tmp_path / "mcp-secrets.json"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert b"tok-abcdef-123456" in secrets.read_bytes()
    admin = McpAdmin(tmp_path / "chalie.db", tmp_path)
    text = json.dumps([admin.show(n) for n in ("filesystem", "tasktracker", "q")])
    assert "tok-abcdef" not in text and "ghp_secret" not in text and "pa55word" not in text
    assert "${secret:tasktracker.header.authorization}" in text
    resolved = resolve(admin.spec("tasktracker"), admin.secrets)
    assert resolved.headers["Authorization"] == "Bearer tok-abcdef-123456"
    q = resolve(admin.spec("q"), admin.secrets)
    assert "pa55word" in q.url and "api_key=k3y-value" in q.url
    admin.remove("tasktracker")
    assert b"tok-abcdef" not in secrets.read_bytes()
    admin.close()


def test_a_missing_reference_names_itself_not_a_value(tmp_path: Path) -> None:
    spec = ServerSpec(
        name="x",
        transport="http",
        url="https://h/mcp",
        headers={"Authorization": "Bearer ${CHALIE_TEST_UNSET_VAR}"},
    )
    with pytest.raises(MissingSecret, match="CHALIE_TEST_UNSET_VAR"):
        resolve(spec, SecretFile(tmp_path), environ={})
    ok = resolve(spec, SecretFile(tmp_path), environ={"CHALIE_TEST_UNSET_VAR": "v"})
    assert ok.headers["Authorization"] == "Bearer v"
    assert shown(spec)["headers"]["Authorization"] == "Bearer ${CHALIE_TEST_UNSET_VAR}"
    literal = ServerSpec(name="x", transport="http", url="https://h/mcp", headers={"K": "raw"})
    assert shown(literal)["headers"]["K"] == "<hidden, 3 characters>"
    assert seal(literal, SecretFile(tmp_path)).headers["K"] == "${secret:x.header.k}"


def test_admin_refuses_unknown_and_duplicate_servers(tmp_path: Path) -> None:
    admin = McpAdmin(tmp_path / "chalie.db", tmp_path)
    admin.add(spec_from_options("a", url="https://h/mcp"))
    with pytest.raises(McpAdminError, match="already exists"):
        admin.add(spec_from_options("a", url="https://h/mcp"))
    for op in ("show", "tools", "remove", "approve", "spec"):
        with pytest.raises(McpAdminError, match="no MCP server"):
            getattr(admin, op)("nope")
    assert os.path.exists(tmp_path / "chalie.db")
    admin.close()


def test_only_a_url_without_a_type_falls_back_to_sse() -> None:
    from chalie.mcp.importing import parse_servers

    parsed = parse_servers(
        json.dumps(
            {
                "mcpServers": {
                    "bare": {"url": "https://example.com/sse"},
                    "typed": {"type": "http", "url": "https://example.com/mcp"},
                    "old": {"type": "sse", "url": "https://example.com/sse"},
                }
            }
        )
    )
    got = {s.name: (s.transport, s.sse_fallback) for s in parsed.specs}
    assert got == {"bare": ("http", True), "typed": ("http", False), "old": ("sse", False)}
