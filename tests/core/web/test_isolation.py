"""Isolation made real: raw web tools off discovery and on their channels only; MCP tools scoped
to channels; a channel pinning a missing tool (or naming an unset model) stops the start; the
playbooks name only tools that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from chalie.calls.registry import Registry
from chalie.conversation.channels import SHIPPED, channel_problems, resolve_channels
from chalie.mcp.importing import spec_from_entry, spec_from_options
from chalie.mcp.proxy import install, proxy_class, scoped_to
from chalie.mcp.spec import SpecError
from chalie.mcp.tools import ToolRow
from chalie.process.config import Config
from chalie.process.daemon import StartupError
from chalie_app.root import prepare

RAW = ("search", "web_fetch", "read", "browser")
SKILLS = Path(__file__).resolve().parents[3] / "abilities" / "skills"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.collect()


def test_the_raw_web_tools_are_not_discoverable_and_pinned_on_the_web_channels_only(
    registry: Registry,
) -> None:
    for name in RAW:
        entry = registry.get(name)
        assert entry is not None and entry.cls.discoverable is False, name
        where = [c.name for c in SHIPPED.values() if name in c.tools()]
        assert set(where) <= {"web-search", "web-browse"} and where, (name, where)
    for name in ("web_search", "web_browse"):
        entry = registry.get(name)
        assert entry is not None and entry.cls.discoverable is True
    assert SHIPPED["web-search"].tools() == ("search", "web_fetch", "read")
    assert SHIPPED["web-browse"].tools() == ("browser", "web_fetch", "read")
    for delegate in ("web-search", "web-browse"):
        assert "find_tools" not in SHIPPED[delegate].tools()
        assert SHIPPED[delegate].policy_channel == "subconscious"


def test_every_shipped_channel_pins_only_tools_that_exist(registry: Registry) -> None:
    assert channel_problems(resolve_channels({}), registry.names(), []) == []


def test_a_channel_pinning_a_missing_tool_or_an_unset_model_is_one_line(
    registry: Registry,
) -> None:
    config = Config.from_mapping(
        {"channels": {"research": {"pinned": ["web_serch"], "model": "big"}}}, home=Path("/tmp")
    )
    problems = channel_problems(resolve_channels(config.channels), registry.names(), config.models)
    assert problems == [
        "channel research pins tool 'web_serch', which does not exist",
        "channel research uses model 'big', which is not configured "
        "(add [models.big] to config.toml)",
    ]
    remote = channel_problems(
        resolve_channels(
            {"x": msgspec.convert({"pinned": ["_mcp_srv_tool"]}, type(config.channels["research"]))}
        ),
        registry.names(),
        [],
    )
    assert remote == []  # a remote tool's pin is checked when its server connects


def test_the_daemon_refuses_to_start_on_a_bad_pin(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[channels.web-search]\npinned = ["web_serch"]\n')
    config = Config.load(tmp_path)
    config.layout.create()
    with pytest.raises(StartupError) as caught:
        prepare(config)
    assert str(caught.value) == "channel web-search pins tool 'web_serch', which does not exist"
    assert "\n" not in str(caught.value)


def _row(server: str = "fetchsrv", remote: str = "fetch") -> ToolRow:
    from tests.core.mcp.test_tools_and_results import first_sync, tool

    (row,) = first_sync(tool(remote, "Fetches a URL."))
    return msgspec.structs.replace(row, server=server, proxy=f"_mcp_{server}_{remote}")


def test_an_mcp_server_can_be_scoped_to_channels() -> None:
    row = _row()
    everywhere = proxy_class(row)
    assert everywhere.discoverable and everywhere.mcp_channels == ()  # the default, as before
    scoped = proxy_class(row, channels=("web-browse",))
    assert not scoped.discoverable and scoped.mcp_channels == ("web-browse",)
    registry = Registry()
    installed = install(registry, [row], enabled=True, timeout=5, channels=("web-browse",))
    assert installed.index == []  # not handed to discovery
    assert scoped_to(registry, "web-browse") == (row.proxy,)
    assert scoped_to(registry, "chat") == ()
    # scoping it later replaces the discoverable class and drops it from discovery
    registry2 = Registry()
    install(registry2, [row], enabled=True, timeout=5)
    again = install(registry2, [row], enabled=True, timeout=5, channels=("web-browse",))
    assert again.drop == [row.proxy]


def test_the_channels_key_is_checked() -> None:
    spec = spec_from_options(
        "fetch", command="mcp-server-fetch", options={"channels": ("web-browse",)}
    )
    assert spec.channels == ("web-browse",)
    entry = spec_from_entry("x", {"command": "c", "channels": ["web-browse", "web-browse"]})
    assert entry.channels == ("web-browse",)
    for bad in (["Web Browse"], ["x" * 100], "web-browse", [1]):
        with pytest.raises(SpecError):
            spec_from_entry("x", {"command": "c", "channels": bad})


_NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
_LIST = re.compile(r"\[([^\]]*)\]")


def named_tools(text: str) -> set[str]:
    """What a playbook names as a tool: `snake_case` in backticks, and bare names in the
    lists it hands find_tools (``["clock", "web_search"]``; a sentence there is a
    described action, which discovery answers)."""
    names: set[str] = set()
    for quoted in re.findall(r"`([^`]+)`", text):
        if _NAME.match(quoted) or quoted in {"clock", "calculator", "read", "search", "browser"}:
            names.add(quoted)
        for listed in _LIST.findall(quoted):
            try:
                entries = json.loads(f"[{listed}]")
            except ValueError:
                continue
            names.update(e for e in entries if isinstance(e, str) and re.match(r"^[a-z_]+$", e))
    return names


def test_the_playbooks_name_only_tools_that_exist(registry: Registry) -> None:
    files = sorted(SKILLS.glob("*.md"))
    assert files
    seen: set[str] = set()
    for path in files:
        names = named_tools(path.read_text())
        missing = sorted(n for n in names if registry.get(n) is None)
        assert not missing, f"{path.name} names tools that do not exist: {missing}"
        seen |= names
    assert {"find_tools", "web_search", "clock", "calculator"} <= seen


def test_the_playbook_check_can_fail() -> None:
    assert named_tools('Call `web_serch`, or `find_tools(["weather"])`.') == {
        "web_serch",
        "weather",
    }
