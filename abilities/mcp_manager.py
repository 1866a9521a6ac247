"""mcp_manager: list, add, enable, disable, test and remove remote MCP connections by asking.

"Connect to the MCP server at https://mcp.example.com/mcp and call it
task-tracker" becomes ``action=add, name=task-tracker, url=...``. The risky
actions (add, remove, enable) are their own permissions
(``mcp_manager.add`` ...), so each defaults to ``ask``; list, test and
disable share the tool's own permission. Header values are secrets: they
are redacted on the trail and stored in the 0600 secrets file, never in the
database.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult

RISKY: Final = frozenset({"add", "remove", "enable"})
Name = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=64, description="the connection's name, e.g. task-tracker"
    ),
]


class McpManagerParams(msgspec.Struct, forbid_unknown_fields=True):
    """Manage the remote MCP servers whose tools Chalie can use."""

    action: Literal["list", "add", "enable", "disable", "test", "remove"] = "list"
    name: Name | None = None
    url: (
        Annotated[str, msgspec.Meta(max_length=2048, description="the server's http(s) URL (add)")]
        | None
    ) = None
    transport: Literal["http", "sse"] | None = None
    command: (
        Annotated[
            str, msgspec.Meta(max_length=4096, description="a local stdio server's command (add)")
        ]
        | None
    ) = None
    args: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=4096)]], msgspec.Meta(max_length=128)
    ] = []
    headers: Annotated[
        dict[str, Annotated[str, msgspec.Meta(max_length=8192)]], msgspec.Meta(max_length=64)
    ] = {}


class McpManager(Ability):
    name = "mcp_manager"
    summary = (
        "List, add, enable, disable, test or remove connections to remote MCP servers, whose "
        "tools then become available."
    )
    tooltip = "Manage MCP server connections"
    examples = (
        "connect to the MCP server at https://mcp.example.com/mcp and call it task-tracker",
        "which MCP servers are connected?",
        "disable the github MCP server",
        "test the connection to my notes MCP server",
        "remove the task-tracker MCP connection",
        "turn the home automation MCP server back on",
    )
    Params = McpManagerParams
    actions = {
        "list": (),
        "add": ("name",),
        "enable": ("name",),
        "disable": ("name",),
        "test": ("name",),
        "remove": ("name",),
    }
    sensitive = frozenset({"headers"})
    timeout = 60.0

    def classify(self, params: Mapping[str, Any]) -> str | None:
        action = params.get("action", "list")
        return action if action in RISKY else None

    def reach(self, params: Mapping[str, Any]) -> str | None:
        """add (a command to run, or a server to connect to), enable and remove (a delete)
        are sensitive."""
        action = params.get("action", "list")
        if action == "remove":
            name = str(params.get("name") or "?")
            return f"removes the MCP server {name!r} (it {self._what(name)})"
        if action == "add":
            command = params.get("command")
            if command:
                argv = [str(command), *(str(a) for a in params.get("args") or ())]
                return f"runs the command: {shlex.join(argv)}"
            return f"connects Chalie to {params.get('url') or '?'!s}"
        if action == "enable":
            return f"starts the MCP server {str(params.get('name') or '?')!r}: " + self._what(
                str(params.get("name") or "")
            )
        return None

    def _what(self, name: str) -> str:
        """What an existing server runs or reaches, from its stored spec."""
        admin = self.services.mcp if self.services is not None else None
        try:
            spec = admin.spec(name) if admin is not None else None
        except Exception:
            spec = None
        if spec is None:
            return "its stored command is unknown"
        if spec.command:
            line = "runs the command: " + shlex.join([spec.command, *spec.args])
            if spec.env:
                line += " with environment " + ", ".join(sorted(spec.env))
            return line
        return f"connects to {spec.url}"

    def run(self, params: McpManagerParams) -> ToolResult:
        admin = self.services.mcp if self.services is not None else None
        if admin is None:
            return ToolResult.error(
                "internal-error",
                "MCP connections are not available in this runtime.",
                hint="this is a fault in the runtime's set-up, not in your call.",
            )
        from chalie.mcp.admin import McpAdminError
        from chalie.mcp.importing import spec_from_options
        from chalie.mcp.spec import SpecError

        name = params.name or ""
        try:
            if params.action == "list":
                return ToolResult.success({"servers": admin.list()})
            if params.action == "add":
                if params.url is None and params.command is None:
                    return ToolResult.error(
                        "missing-params",
                        "mcp_manager add needs url or command.",
                        hint="pass the server's url (or a local command) with the name.",
                        meta={"param": "url"},
                    )
                spec = spec_from_options(
                    name,
                    command=params.command,
                    args=params.args,
                    url=params.url,
                    transport=params.transport,
                    headers=[f"{k}: {v}" for k, v in params.headers.items()],
                )
                shown = admin.add(spec)
                return ToolResult.success(
                    {
                        "added": shown["name"],
                        "transport": shown["transport"],
                        "note": "it connects in the background; its tools appear when it is online",
                    }
                )
            if params.action in ("enable", "disable"):
                return ToolResult.success(admin.set_enabled(name, params.action == "enable"))
            if params.action == "remove":
                return ToolResult.success(admin.remove(name))
            return self._test(admin, name)
        except (McpAdminError, SpecError) as exc:
            return ToolResult.error(
                "invalid-param",
                str(exc)[:300],
                hint="check the name (action list shows them) and the url.",
                meta={"param": "name"},
            )

    def _test(self, admin: Any, name: str) -> ToolResult:
        from chalie.mcp.probe import test_server
        from chalie.mcp.secrets import MissingSecret, resolve

        loop = self.services.loop if self.services is not None else None
        try:
            resolved = resolve(admin.spec(name), admin.secrets)
        except MissingSecret as exc:
            return ToolResult.error(
                "mcp-unreachable",
                str(exc)[:300],
                hint="the operator must provide the missing secret.",
            )
        if loop is None:
            return ToolResult.error(
                "internal-error",
                "no event loop to test the connection on.",
                hint="this is a fault in the runtime's set-up.",
            )
        report = loop.submit(test_server(resolved, timeout=min(self.timeout - 5, 30.0))).result(
            self.timeout
        )
        if not report["ok"]:
            code = "mcp-auth-failed" if report["kind"] == "auth" else "mcp-unreachable"
            return ToolResult.error(
                code,
                f"{name}: {report['error']}",
                hint=f"the server {name} could not be reached; check its address or credentials.",
            )
        report["tools"] = len(report["tools"])
        return ToolResult.success(report)
