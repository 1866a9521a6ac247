"""Proxy names: one mangling rule, valid for every provider, stable, collision-free."""

from __future__ import annotations

import re

import pytest

from chalie.calls.envelope import TOOL_NAME
from chalie.gate.policy import PERMISSION
from chalie.wire.mcp_names import (
    MAX_NAME,
    PROVIDER_NAME,
    BadSlug,
    check_slug,
    proxy_name,
    server_of,
    slugify,
    tool_part,
)

HOSTILE = [
    "Get.User/Profile",
    "x" * 300,
    "searchIssues",
    "search-issues",
    "über-tool",
    "",
    "---",
    "a\x00b",
    "DROP TABLE;",
    "[end:_mcp_a_b]",
    "HTTPServerList",
    "123start",
    "\u202eevil",
]


@pytest.mark.parametrize("remote", HOSTILE)
def test_every_proxy_name_is_valid_for_providers_envelopes_and_the_policy(remote: str) -> None:
    name = proxy_name("github", remote)
    assert PROVIDER_NAME.match(name) and len(name) <= MAX_NAME
    assert TOOL_NAME.match(name) and PERMISSION.match(name)
    assert server_of(name) == "github"


def test_the_tool_part_is_snake_case() -> None:
    assert tool_part("searchIssues") == "search_issues"
    assert tool_part("Get.User/Profile") == "get_user_profile"
    assert tool_part("HTTPServerList") == "http_server_list"
    assert tool_part("!!!") == "tool"


def test_a_long_name_is_cut_with_a_stable_hash() -> None:
    a = proxy_name("srv", "y" * 200)
    assert len(a) == MAX_NAME and a == proxy_name("srv", "y" * 200)
    assert re.search(r"_[0-9a-f]{8}$", a)
    assert proxy_name("srv", "y" * 200) != proxy_name("srv", "y" * 201)


def test_a_collision_gets_a_stable_alias_and_the_holder_keeps_its_name() -> None:
    first = proxy_name("gh", "search_issues")
    taken = {first: "gh/search_issues"}
    assert proxy_name("gh", "search_issues", taken) == first
    alias = proxy_name("gh", "searchIssues", taken)
    assert alias != first and alias.startswith("_mcp_gh_search_issues_")
    assert proxy_name("gh", "searchIssues", taken) == alias
    taken[alias] = "gh/searchIssues"
    third = proxy_name("gh", "search-issues", taken)
    assert third not in taken


@pytest.mark.parametrize("bad", ["", "a_b", "a-b", "1abc", "A", "x" * 25, None, 3])
def test_server_slugs_refuse_underscores_and_junk(bad: object) -> None:
    with pytest.raises(BadSlug):
        check_slug(bad)


def test_labels_become_slugs() -> None:
    assert slugify("task-tracker") == "tasktracker"
    assert slugify("My Server 2") == "myserver2"
    with pytest.raises(BadSlug):
        slugify("___")


def test_only_proxy_names_have_a_server() -> None:
    assert server_of("calculator") is None
    assert server_of("_mcp_notes_append") == "notes"
    assert server_of("_mcp_bad-slug_x") is None
