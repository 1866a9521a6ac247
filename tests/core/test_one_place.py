"""One rule, one module: the remote-tool prefix, what loopback is and the shape of a client's
id are each written once.

The runtime's packages (chalie, actors, chalie_app, abilities) are read as
source: a string that spells the ``_mcp_`` prefix outside :mod:`chalie.wire.mcp_names`,
or a loopback address or name outside :mod:`chalie.net.loopback`, fails the test
with its file and line. Docstrings and comments may name them (they explain);
code must ask the one module. Tests and tools/ (fixtures and benchmarks that
write names as a client sees them) are not read.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from chalie.brain.access import allowed_hosts
from chalie.mcp_server.app import security
from chalie.net import loopback
from chalie.process.config import ChatConfig, McpServerConfig
from chalie.wire import mcp_names as names

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("chalie", "actors", "chalie_app", "abilities")

# Each rule: what spells it, and the one module allowed to.
RULES = {
    "the _mcp_ prefix": (re.compile(r"(?<![A-Za-z0-9])_mcp_"), "chalie/wire/mcp_names.py"),
    "a loopback address or name": (
        re.compile(r"127\.0\.0\.|::1\b|\[::1\]|(?<![\w.-])localhost\b", re.I),
        "chalie/net/loopback.py",
    ),
    # The id a client names in a request: one shape for the control socket, the chat
    # protocol and the Brain's API (chalie.wire.messages.Id).
    "the shape of a client's id": (
        re.compile(re.escape("[A-Za-z0-9_.:-]")),
        "chalie/wire/messages.py",
    ),
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


@functools.cache
def strings(path: Path) -> tuple[tuple[int, str], ...]:
    """Every string constant in the file's code (f-string parts included), docstrings aside."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    return tuple(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    )


def offenders(pattern: re.Pattern[str], home: str) -> list[str]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == home or not pattern.search(path.read_text()):
                continue  # a file that never spells it has no string that does
            out.extend(
                f"{rel}:{line}: {text[:80]!r}"
                for line, text in strings(path)
                if pattern.search(text)
            )
    return out


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_rule_is_written_in_its_one_module_only(rule: str) -> None:
    pattern, home = RULES[rule]
    assert offenders(pattern, home) == [], f"{rule} belongs in {home}"


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_scan_sees_the_rule_in_its_own_module(rule: str) -> None:
    """The scan is not blind: its own module does spell the rule."""
    pattern, home = RULES[rule]
    assert any(pattern.search(text) for _, text in strings(ROOT / home))


def test_a_spelled_prefix_or_address_elsewhere_is_found(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""A docstring may say _mcp_ and 127.0.0.1."""\n'
        'NAME = f"_mcp_{server}_x"\n'
        'HOST = "127.0.0.1"\n'
        'URL = "http://localhost:80"\n'
        'OTHER = "chalie_mcp_call"\n'
        'Id = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.:-]+$")]\n'
    )
    found = {
        rule: [line for line, text in strings(sample) if RULES[rule][0].search(text)]
        for rule in RULES
    }
    assert found == {
        "the _mcp_ prefix": [2],
        "a loopback address or name": [3, 4],
        "the shape of a client's id": [6],
    }


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LocalHost", True),
        ("api.localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("localhost.example.com", False),
        ("notlocalhost", False),
        ("", False),
    ],
)
def test_what_loopback_is(host: str, loop: bool) -> None:
    assert loopback.is_loopback(host) is loop


def test_the_host_names_a_bound_server_answers() -> None:
    assert loopback.host_names("127.0.0.1") == loopback.NAMES
    assert loopback.host_names("::1") == loopback.NAMES
    assert loopback.host_names("127.0.0.2") == (*loopback.NAMES, "127.0.0.2")
    assert loopback.host_names("fe80::1") == (*loopback.NAMES, "[fe80::1]")


def test_the_remote_tool_names_come_from_one_module() -> None:
    assert names.server_wildcard("github") == "_mcp_github_*"
    assert names.SERVER_WILDCARD.match(names.server_wildcard("github"))
    assert names.server_of(names.proxy_name("github", "searchIssues")) == "github"
    assert names.server_permission("github", "sampling") == "_mcp_github.sampling"
    assert names.is_proxy_name(names.server_tool("github"))


@pytest.mark.parametrize("host", ["127.0.0.2", "[::1]", "localhost", "0.0.0.0", "192.0.2.7"])
def test_the_chat_bridge_the_mcp_server_and_the_brain_agree_on_a_host(host: str) -> None:
    """Before, the chat bridge refused 127.0.0.2 that the MCP server bound, and the MCP
    server's rebinding guard did not answer to the loopback address it was bound to."""
    local = loopback.is_loopback(host)
    if local:
        ChatConfig(host=host)  # no allow_remote needed
    else:
        with pytest.raises(ValueError, match="is not loopback"):
            ChatConfig(host=host)
    mcp = security(McpServerConfig(host=host, allow_remote=True), 8462)
    assert frozenset(mcp.allowed_hosts) == allowed_hosts(host, 8462)
    assert f"{host if ':' not in host else '[' + host.strip('[]') + ']'}:8462" in mcp.allowed_hosts
