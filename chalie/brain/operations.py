"""The operation table: every REST endpoint, and so every dashboard action, is one row.

A row names the backend method that does the work, the HTTP method and path under
``/api/v1``, the Struct its path parameters match, the Struct its query (GET) or JSON body
(anything else) matches, and the type it answers with. The REST routes, the dashboard's
actions and the OpenAPI document are all built from this table, so they cannot drift.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from chalie.brain import api
from chalie.wire.principals import Principal

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
    """What the operations need of the running daemon: one typed method a row.

    Each row of :data:`OPERATIONS` is made from one of these methods (its name is the
    row's ``name``), so mypy sees that every operation has its method, and that the
    implementation (``chalie_app.brain_backend.RuntimeBackend``) has each with this signature.
    A method takes the path Struct and the argument Struct; a ``caller`` row's also
    takes the signed-in caller.
    """

    def overview(self, _path: Any, _args: api.Empty) -> api.Overview: ...

    def approvals(self, _path: Any, _args: api.Empty) -> list[api.Approval]: ...

    def answer(
        self, path: api.RequestPath, args: api.AnswerBody, who: Principal
    ) -> api.Answered: ...

    def approval_history(self, _path: Any, args: api.HistoryQuery) -> list[api.HistoryRow]: ...

    def agent_exchanges(self, _path: Any, args: api.ExchangeQuery) -> list[api.ExchangeRow]: ...

    def policy(self, _path: Any, args: api.PolicyQuery) -> api.PolicyPage: ...

    def policy_set(self, _path: Any, args: api.PolicySet) -> api.PolicyRowView: ...

    def policy_reset(self, _path: Any, args: api.PolicyReset) -> api.Removed: ...

    def mcp_server(self, _path: Any, _args: api.Empty) -> api.McpServerView: ...

    def mcp_server_change(self, _path: Any, args: api.McpServerChange) -> api.McpServerView: ...

    def tokens(self, _path: Any, _args: api.Empty) -> list[api.TokenView]: ...

    def token_create(self, _path: Any, args: api.TokenCreate) -> api.CreatedToken: ...

    def token_regenerate(self, path: api.NamePath, _args: api.Empty) -> api.CreatedToken: ...

    def token_revoke(self, path: api.NamePath, _args: api.Empty) -> api.TokenView: ...

    def tools(self, _path: Any, _args: api.Empty) -> list[api.ToolInfo]: ...

    def tool_call(
        self, path: api.NamePath, args: api.ToolCallBody, who: Principal
    ) -> api.ToolCallResult: ...

    def remotes(self, _path: Any, _args: api.Empty) -> list[api.RemoteView]: ...

    def remote_add(self, _path: Any, args: api.RemoteAdd) -> api.RemoteView: ...

    def remote_import(self, _path: Any, args: api.RemoteImport) -> api.Imported: ...

    def remote_test(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone: ...

    def remote_enable(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone: ...

    def remote_disable(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone: ...

    def remote_remove(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone: ...

    def remote_tools(self, path: api.NamePath, _args: api.Empty) -> list[api.RemoteToolView]: ...

    def remote_log(self, path: api.NamePath, args: api.LogQuery) -> api.RemoteLog: ...

    def remote_approve(self, path: api.NamePath, args: api.ApproveBody) -> api.ApprovedTools: ...

    def trail(self, _path: Any, args: api.TrailQuery) -> api.TrailPage: ...

    def usage(self, _path: Any, args: api.UsageQuery) -> api.UsageView: ...

    def trail_export(self, _path: Any, args: api.TrailExportQuery) -> Iterator[str]: ...

    def accounts(self, _path: Any, _args: api.Empty) -> list[api.AccountRow]: ...

    def conversations(
        self, _path: Any, args: api.ConversationsQuery
    ) -> list[api.ConversationRow]: ...

    def conversation(
        self, path: api.ConversationPath, _args: api.Empty
    ) -> api.ConversationView: ...

    def conversation_delete(self, path: api.ConversationPath, _args: api.Empty) -> api.Deleted: ...

    def discovery_try(self, _path: Any, args: api.DiscoveryTry) -> api.DiscoveryAnswer: ...

    def examples(self, _path: Any, args: api.ExamplesQuery) -> list[api.ExampleView]: ...

    def example_forget(self, path: api.ExamplePath, _args: api.Empty) -> api.Forgotten: ...

    def memories(self, _path: Any, args: api.MemoriesQuery) -> api.MemoriesPage: ...

    def memory_search(self, _path: Any, args: api.MemorySearch) -> list[api.MemoryView]: ...

    def memory_forget(self, path: api.MemoryPath, _args: api.Empty) -> api.MemoryForgotten: ...

    def memories_forgotten(self, _path: Any, args: api.ForgottenQuery) -> list[api.MemoryView]: ...

    def memory_restore(self, path: api.MemoryPath, _args: api.Empty) -> api.MemoryView: ...

    def memory_promote(self, path: api.MemoryPath, _args: api.Empty) -> api.MemoryView: ...

    def reminders(self, _path: Any, args: api.RemindersQuery) -> list[api.ReminderView]: ...

    def reminder_cancel(self, path: api.ReminderPath, _args: api.Empty) -> api.ReminderView: ...


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
    run: Callable[..., Any],
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
    """One row; ``run`` is the :class:`Backend` method that does the work (its name is the
    row's)."""
    name = run.__name__
    return Operation(name, method, path, args, result, summary, page, path_args, download, caller)


OPERATIONS: Final[tuple[Operation, ...]] = (
    op(
        Backend.overview,
        "GET",
        "/overview",
        api.Empty,
        api.Overview,
        "The daemon at a glance",
        "overview",
    ),
    op(
        Backend.approvals,
        "GET",
        "/approvals",
        api.Empty,
        list[api.Approval],
        "Pending permission requests",
        "approvals",
    ),
    op(
        Backend.answer,
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
        Backend.approval_history,
        "GET",
        "/approvals/history",
        api.HistoryQuery,
        list[api.HistoryRow],
        "Calls a human decided, newest first",
        "approvals",
    ),
    op(
        Backend.agent_exchanges,
        "GET",
        "/exchanges",
        api.ExchangeQuery,
        list[api.ExchangeRow],
        "What agents asked Chalie with loop_in_human, and its answers, newest first",
        "approvals",
    ),
    op(
        Backend.policy,
        "GET",
        "/policy",
        api.PolicyQuery,
        api.PolicyPage,
        "The permission table, filtered",
        "policy",
    ),
    op(
        Backend.policy_set,
        "PUT",
        "/policy",
        api.PolicySet,
        api.PolicyRowView,
        "Set one (channel, permission)",
        "policy",
    ),
    op(
        Backend.policy_reset,
        "POST",
        "/policy/reset",
        api.PolicyReset,
        api.Removed,
        "Forget settings: all, a channel's, a permission's, or one pair",
        "policy",
    ),
    op(
        Backend.mcp_server,
        "GET",
        "/mcp-server",
        api.Empty,
        api.McpServerView,
        "The inbound MCP server",
        "mcp_server",
    ),
    op(
        Backend.mcp_server_change,
        "PATCH",
        "/mcp-server",
        api.McpServerChange,
        api.McpServerView,
        "Change the inbound MCP server in config.toml; restarts its actor, not the daemon",
        "mcp_server",
    ),
    op(
        Backend.tokens,
        "GET",
        "/tokens",
        api.Empty,
        list[api.TokenView],
        "Tokens, with their last use",
        "mcp_server",
    ),
    op(
        Backend.token_create,
        "POST",
        "/tokens",
        api.TokenCreate,
        api.CreatedToken,
        "Create a token; its secret is in this answer only",
        "mcp_server",
    ),
    op(
        Backend.token_regenerate,
        "POST",
        "/tokens/{name}/regenerate",
        api.Empty,
        api.CreatedToken,
        "A new secret for a token in one step (the old one stops working; its id stays)",
        "mcp_server",
        path_args=api.NamePath,
    ),
    op(
        Backend.token_revoke,
        "DELETE",
        "/tokens/{name}",
        api.Empty,
        api.TokenView,
        "Revoke a token (its sessions end too)",
        "mcp_server",
        path_args=api.NamePath,
    ),
    op(
        Backend.tools,
        "GET",
        "/tools",
        api.Empty,
        list[api.ToolInfo],
        "Every tool a person may call, with the JSON Schema of its arguments",
        "tools",
    ),
    op(
        Backend.tool_call,
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
        Backend.remotes,
        "GET",
        "/mcp/servers",
        api.Empty,
        list[api.RemoteView],
        "Remote MCP servers",
        "remote",
    ),
    op(
        Backend.remote_add,
        "POST",
        "/mcp/servers",
        api.RemoteAdd,
        api.RemoteView,
        "Add a remote MCP server",
        "remote",
    ),
    op(
        Backend.remote_import,
        "POST",
        "/mcp/import",
        api.RemoteImport,
        api.Imported,
        "Add servers from a pasted mcpServers JSON",
        "remote",
    ),
    op(
        Backend.remote_test,
        "POST",
        "/mcp/servers/{name}/test",
        api.Empty,
        api.RemoteDone,
        "Connect to a server once and report",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        Backend.remote_enable,
        "POST",
        "/mcp/servers/{name}/enable",
        api.Empty,
        api.RemoteDone,
        "Enable a server",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        Backend.remote_disable,
        "POST",
        "/mcp/servers/{name}/disable",
        api.Empty,
        api.RemoteDone,
        "Disable a server",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        Backend.remote_remove,
        "DELETE",
        "/mcp/servers/{name}",
        api.Empty,
        api.RemoteDone,
        "Remove a server, its tools and its secrets",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        Backend.remote_tools,
        "GET",
        "/mcp/servers/{name}/tools",
        api.Empty,
        list[api.RemoteToolView],
        "A server's tools with provenance, quarantined ones with their diff",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        Backend.remote_log,
        "GET",
        "/mcp/servers/{name}/log",
        api.LogQuery,
        api.RemoteLog,
        "A server's last log lines: its stderr, log messages and notifications",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        Backend.remote_approve,
        "POST",
        "/mcp/servers/{name}/approve",
        api.ApproveBody,
        api.ApprovedTools,
        "Approve a server's quarantined tools (one, or all)",
        "remote",
        path_args=api.NamePath,
    ),
    op(
        Backend.trail,
        "GET",
        "/trail",
        api.TrailQuery,
        api.TrailPage,
        "The action trail, newest first, by keyset",
        "trail",
    ),
    op(
        Backend.usage,
        "GET",
        "/usage",
        api.UsageQuery,
        api.UsageView,
        "Calls, error rate and p50/p95 latency per tool and per remote server (hour or day)",
        "trail",
    ),
    op(
        Backend.trail_export,
        "GET",
        "/trail/export",
        api.TrailExportQuery,
        str,
        "The filtered trail as JSONL or CSV",
        "trail",
        download=True,
    ),
    op(
        Backend.accounts,
        "GET",
        "/accounts",
        api.Empty,
        list[api.AccountRow],
        "The person's accounts (calendar, contacts, email): kind, name, default; no secret",
        "accounts",
    ),
    op(
        Backend.conversations,
        "GET",
        "/conversations",
        api.ConversationsQuery,
        list[api.ConversationRow],
        "Conversations, most recent first",
        "conversations",
    ),
    op(
        Backend.conversation,
        "GET",
        "/conversations/{conversation_id}",
        api.Empty,
        api.ConversationView,
        "One conversation: messages, tool calls and results, events",
        "conversations",
        path_args=api.ConversationPath,
    ),
    op(
        Backend.conversation_delete,
        "DELETE",
        "/conversations/{conversation_id}",
        api.Empty,
        api.Deleted,
        "Delete a conversation",
        "conversations",
        path_args=api.ConversationPath,
    ),
    op(
        Backend.discovery_try,
        "POST",
        "/discovery/try",
        api.DiscoveryTry,
        api.DiscoveryAnswer,
        "Run a tool search and show which rung answered, with distances",
        "discovery",
    ),
    op(
        Backend.examples,
        "GET",
        "/discovery/examples",
        api.ExamplesQuery,
        list[api.ExampleView],
        "Learned examples",
        "discovery",
    ),
    op(
        Backend.example_forget,
        "DELETE",
        "/discovery/examples/{id}",
        api.Empty,
        api.Forgotten,
        "Forget one learned example",
        "discovery",
        path_args=api.ExamplePath,
    ),
    op(
        Backend.memories,
        "GET",
        "/memories",
        api.MemoriesQuery,
        api.MemoriesPage,
        "Memories, newest first: the owner's, then each agent's apart, with provenance",
        "memory",
    ),
    op(
        Backend.memory_search,
        "GET",
        "/memories/search",
        api.MemorySearch,
        list[api.MemoryView],
        "Recall memories by topic and/or place, as the memory ability does",
        "memory",
    ),
    op(
        Backend.memory_forget,
        "DELETE",
        "/memories/{id}",
        api.Empty,
        api.MemoryForgotten,
        "Forget a memory (the owner's or an agent's)",
        "memory",
        path_args=api.MemoryPath,
    ),
    op(
        Backend.memories_forgotten,
        "GET",
        "/memories/forgotten",
        api.ForgottenQuery,
        list[api.MemoryView],
        "Forgotten memories, restorable for 30 days after they were forgotten, then purged",
        "memory",
    ),
    op(
        Backend.memory_restore,
        "POST",
        "/memories/{id}/restore",
        api.Empty,
        api.MemoryView,
        "Restore a forgotten memory, with its id",
        "memory",
        path_args=api.MemoryPath,
    ),
    op(
        Backend.memory_promote,
        "POST",
        "/memories/{id}/promote",
        api.Empty,
        api.MemoryView,
        "Make an agent's memory the owner's",
        "memory",
        path_args=api.MemoryPath,
    ),
    op(
        Backend.reminders,
        "GET",
        "/reminders",
        api.RemindersQuery,
        list[api.ReminderView],
        "Reminders: pending (next first), fired or late (newest first), or all",
        "reminders",
    ),
    op(
        Backend.reminder_cancel,
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
