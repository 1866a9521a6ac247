"""The operation table: every REST endpoint, and so every dashboard action, is one row.

A row names the backend method that does the work, the HTTP method and path under
``/api/v1``, the Struct its path parameters match, the Struct its query (GET) or JSON body
(anything else) matches, and the type it answers with. The REST routes, the dashboard's
actions and the OpenAPI document are all built from this table, so they cannot drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Protocol

from chalie.brain import api

PREFIX: Final = "/api/v1"
_PARAM: Final = re.compile(r"\{([a-z_]+)(?::[a-z]+)?\}")


class ApiProblem(Exception):
    """A refusal the backend reports: HTTP status, stable code, one line."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class Backend(Protocol):
    """What the operations need of the running daemon; one method a row, named by ``name``."""

    def __getattr__(self, name: str) -> Any: ...


@dataclass(frozen=True)
class Operation:
    name: str
    method: str
    path: str
    args: type[api.Struct]
    result: Any
    summary: str
    page: str
    path_args: type[api.Struct] | None = None
    # The answer is a download (JSONL or CSV), not a JSON document.
    download: bool = False
    # The backend method takes the signed-in caller (a Principal) as a third argument.
    caller: bool = False

    @property
    def changes(self) -> bool:
        return self.method != "GET"

    @property
    def params(self) -> list[str]:
        return _PARAM.findall(self.path)

    @property
    def openapi_path(self) -> str:
        return PREFIX + _PARAM.sub(r"{\1}", self.path)


def op(
    name: str,
    method: str,
    path: str,
    args: type[api.Struct],
    result: Any,
    summary: str,
    page: str,
    *,
    path_args: type[api.Struct] | None = None,
    download: bool = False,
    caller: bool = False,
) -> Operation:
    return Operation(name, method, path, args, result, summary, page, path_args, download, caller)


OPERATIONS: Final[tuple[Operation, ...]] = (
    op(
        "overview",
        "GET",
        "/overview",
        api.Empty,
        api.Overview,
        "The daemon at a glance",
        "overview",
    ),
    op(
        "approvals",
        "GET",
        "/approvals",
        api.Empty,
        list[api.Approval],
        "Pending permission requests",
        "approvals",
    ),
    op(
        "answer",
        "POST",
        "/approvals/{request_id}/answer",
        api.AnswerBody,
        api.Answered,
        "Answer a permission request: allow once, allow always, or deny",
        "approvals",
        path_args=api.RequestPath,
        caller=True,
    ),
    op(
        "approval_history",
        "GET",
        "/approvals/history",
        api.HistoryQuery,
        list[api.HistoryRow],
        "Calls a human decided, newest first",
        "approvals",
    ),
    op(
        "agent_exchanges",
        "GET",
        "/exchanges",
        api.ExchangeQuery,
        list[api.ExchangeRow],
        "What agents asked Chalie with loop_in_human, and its answers, newest first",
        "approvals",
    ),
    op(
        "policy",
        "GET",
        "/policy",
        api.PolicyQuery,
        api.PolicyPage,
        "The permission table, filtered",
        "policy",
    ),
    op(
        "policy_set",
        "PUT",
        "/policy",
        api.PolicySet,
        api.PolicyRowView,
        "Set one (channel, permission)",
        "policy",
    ),
    op(
        "policy_reset",
        "POST",
        "/policy/reset",
        api.PolicyReset,
        api.Removed,
        "Forget settings: all, a channel's, a permission's, or one pair",
        "policy",
    ),
    op(
        "mcp_server",
        "GET",
        "/mcp-server",
        api.Empty,
        api.McpServerView,
        "The inbound MCP server",
        "mcp_server",
    ),
    op(
        "mcp_server_change",
        "PATCH",
        "/mcp-server",
        api.McpServerChange,
        api.McpServerView,
        "Change the inbound MCP server in config.toml; restarts its actor, not the daemon",
        "mcp_server",
    ),
    op(
        "tokens",
        "GET",
        "/tokens",
        api.Empty,
        list[api.TokenView],
        "Tokens, with their last use",
        "mcp_server",
    ),
    op(
        "token_create",
        "POST",
        "/tokens",
        api.TokenCreate,
        api.CreatedToken,
        "Create a token; its secret is in this answer only",
        "mcp_server",
    ),
    op(
        "token_regenerate",
        "POST",
        "/tokens/{name}/regenerate",
        api.Empty,
        api.CreatedToken,
        "A new secret for a token in one step (the old one stops working; its id stays)",
        "mcp_server",
        path_args=api.NamePath,
    ),
    op(
        "token_revoke",
        "DELETE",
        "/tokens/{name}",
        api.Empty,
        api.TokenView,
        "Revoke a token (its sessions end too)",
        "mcp_server",
        path_args=api.NamePath,
    ),
    op(
        "tools",
        "GET",
        "/tools",
        api.Empty,
        list[api.ToolInfo],
        "Every tool a person may call, with the JSON Schema of its arguments",
        "tools",
    ),
    op(
        "tool_call",
        "POST",
        "/tools/{name}/call",
        api.ToolCallBody,
        api.ToolCallResult,
        "Call a tool as the signed-in owner on the chat channel, through the gate",
        "tools",
        path_args=api.NamePath,
        caller=True,
    ),
    op(
        "remotes",
        "GET",
        "/mcp/servers",
        api.Empty,
        list[api.RemoteView],
        "Remote MCP servers",
        "remote",
    ),
    op(
        "remote_add",
        "POST",
        "/mcp/servers",
        api.RemoteAdd,
        api.RemoteView,
        "Add a remote MCP server",
        "remote",
    ),
    op(
        "remote_import",
        "POST",
        "/mcp/import",
        api.RemoteImport,
        api.Imported,
        "Add servers from a pasted mcpServers JSON",
        "remote",
    ),
    op(
        "remote_test",
        "POST",
        "/mcp/servers/{name}/test",
        api.Empty,
        api.RemoteDone,
        "Connect to a server once and report",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        "remote_enable",
        "POST",
        "/mcp/servers/{name}/enable",
        api.Empty,
        api.RemoteDone,
        "Enable a server",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        "remote_disable",
        "POST",
        "/mcp/servers/{name}/disable",
        api.Empty,
        api.RemoteDone,
        "Disable a server",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        "remote_remove",
        "DELETE",
        "/mcp/servers/{name}",
        api.Empty,
        api.RemoteDone,
        "Remove a server, its tools and its secrets",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        "remote_tools",
        "GET",
        "/mcp/servers/{name}/tools",
        api.Empty,
        list[api.RemoteToolView],
        "A server's tools with provenance, quarantined ones with their diff",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        "remote_log",
        "GET",
        "/mcp/servers/{name}/log",
        api.LogQuery,
        api.RemoteLog,
        "A server's last log lines: its stderr, log messages and notifications",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        "remote_approve",
        "POST",
        "/mcp/servers/{name}/approve",
        api.ApproveBody,
        api.ApprovedTools,
        "Approve a server's quarantined tools (one, or all)",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        "trail",
        "GET",
        "/trail",
        api.TrailQuery,
        api.TrailPage,
        "The action trail, newest first, by keyset",
        "trail",
    ),
    op(
        "usage",
        "GET",
        "/usage",
        api.UsageQuery,
        api.UsageView,
        "Calls, error rate and p50/p95 latency per tool and per remote server (hour or day)",
        "trail",
    ),
    op(
        "trail_export",
        "GET",
        "/trail/export",
        api.TrailExportQuery,
        str,
        "The filtered trail as JSONL or CSV",
        "trail",
        download=True,
    ),
    op(
        "accounts",
        "GET",
        "/accounts",
        api.Empty,
        list[api.AccountRow],
        "The person's accounts (calendar, contacts, email): kind, name, default; no secret",
        "accounts",
    ),
    op(
        "conversations",
        "GET",
        "/conversations",
        api.ConversationsQuery,
        list[api.ConversationRow],
        "Conversations, most recent first",
        "conversations",
    ),
    op(
        "conversation",
        "GET",
        "/conversations/{conversation_id}",
        api.Empty,
        api.ConversationView,
        "One conversation: messages, tool calls and results, events",
        "conversations",
        path_args=api.ConversationPath,
    ),
    op(
        "conversation_delete",
        "DELETE",
        "/conversations/{conversation_id}",
        api.Empty,
        api.Deleted,
        "Delete a conversation",
        "conversations",
        path_args=api.ConversationPath,
    ),
    op(
        "discovery_try",
        "POST",
        "/discovery/try",
        api.DiscoveryTry,
        api.DiscoveryAnswer,
        "Run a tool search and show which rung answered, with distances",
        "discovery",
    ),
    op(
        "examples",
        "GET",
        "/discovery/examples",
        api.ExamplesQuery,
        list[api.ExampleView],
        "Learned examples",
        "discovery",
    ),
    op(
        "example_forget",
        "DELETE",
        "/discovery/examples/{id}",
        api.Empty,
        api.Forgotten,
        "Forget one learned example",
        "discovery",
        path_args=api.ExamplePath,
    ),
    op(
        "memories",
        "GET",
        "/memories",
        api.MemoriesQuery,
        api.MemoriesPage,
        "Memories, newest first: the owner's, then each agent's apart, with provenance",
        "memory",
    ),
    op(
        "memory_search",
        "GET",
        "/memories/search",
        api.MemorySearch,
        list[api.MemoryView],
        "Recall memories by topic and/or place, as the memory ability does",
        "memory",
    ),
    op(
        "memory_forget",
        "DELETE",
        "/memories/{id}",
        api.Empty,
        api.MemoryForgotten,
        "Forget a memory (the owner's or an agent's)",
        "memory",
        path_args=api.MemoryPath,
    ),
    op(
        "memories_forgotten",
        "GET",
        "/memories/forgotten",
        api.ForgottenQuery,
        list[api.MemoryView],
        "Forgotten memories, restorable for 30 days after they were forgotten, then purged",
        "memory",
    ),
    op(
        "memory_restore",
        "POST",
        "/memories/{id}/restore",
        api.Empty,
        api.MemoryView,
        "Restore a forgotten memory, with its id",
        "memory",
        path_args=api.MemoryPath,
    ),
    op(
        "memory_promote",
        "POST",
        "/memories/{id}/promote",
        api.Empty,
        api.MemoryView,
        "Make an agent's memory the owner's",
        "memory",
        path_args=api.MemoryPath,
    ),
    op(
        "reminders",
        "GET",
        "/reminders",
        api.RemindersQuery,
        list[api.ReminderView],
        "Reminders: pending (next first), fired or late (newest first), or all",
        "reminders",
    ),
    op(
        "reminder_cancel",
        "POST",
        "/reminders/{id}/cancel",
        api.Empty,
        api.ReminderView,
        "Cancel a pending reminder",
        "reminders",
        path_args=api.ReminderPath,
    ),
)

BY_NAME: Final = {o.name: o for o in OPERATIONS}
