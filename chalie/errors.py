"""The one table of stable error codes a tool result can carry.

A published code never changes meaning and is never renamed; new codes are
appended. README.rst reproduces this table (a test keeps the two in step).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

CODE_PATTERN: Final = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")


class ErrorCode(NamedTuple):
    code: str
    meaning: str
    when: str


ERROR_CODES: Final[tuple[ErrorCode, ...]] = (
    ErrorCode(
        "non-canonical-result",
        "The ability returned something other than a ToolResult.",
        "run() returned a non-ToolResult, or a rich payload that is not plain data.",
    ),
    ErrorCode(
        "unhandled-exception",
        "The ability raised instead of returning an error result.",
        "An exception escaped run(); the traceback goes to the log only.",
    ),
    ErrorCode(
        "unknown-tool",
        "No ability with that name is available to this turn.",
        "A name not registered, or neither pinned nor injected in a restricted turn.",
    ),
    ErrorCode(
        "unknown-action",
        "The action is not one the ability declares.",
        "The call named an action outside the ability's action map.",
    ),
    ErrorCode(
        "missing-params",
        "A required parameter is absent (a missing act_summary is written, not refused).",
        "Pre-validation (the action map, the schema), before the permission gate.",
    ),
    ErrorCode(
        "invalid-param",
        "A parameter does not satisfy the ability's schema or domain.",
        "JSON Schema validation, or the ability rejecting a value.",
    ),
    ErrorCode(
        "permission-denied",
        "The permission gate refused the call.",
        "Policy is deny, or ask where no human is present, or the human said no.",
    ),
    ErrorCode(
        "approval-expired",
        "Nobody answered the permission request in time.",
        "An ask on the chat channel went unanswered until its expiry.",
    ),
    ErrorCode(
        "tool-timeout",
        "The call ran longer than the ability's timeout.",
        "The per-ability timeout elapsed, or a worker stopped heartbeating.",
    ),
    ErrorCode(
        "cancelled",
        "The call was cancelled before it finished.",
        "The turn that made the call was cancelled.",
    ),
    ErrorCode(
        "worker-crashed",
        "The worker process running the call died.",
        "A process-isolated ability's worker exited mid-call.",
    ),
    ErrorCode(
        "interrupted",
        "The daemon stopped while the call was in flight.",
        "Marked on the action trail at the next start after a crash.",
    ),
    ErrorCode(
        "discovery-index-error",
        "The discovery index is missing, corrupt or unreadable.",
        "find_tools or find_skills could not read its index.",
    ),
    ErrorCode(
        "discovery-index-building",
        "The discovery index is still being built; retry shortly.",
        "find_tools or find_skills was called while the index was first built or loaded.",
    ),
    ErrorCode(
        "mcp-unreachable",
        "A remote MCP server did not respond.",
        "Connecting to or calling the named server failed.",
    ),
    ErrorCode(
        "mcp-unknown-tool",
        "No enabled MCP server offers that tool.",
        "A remote tool's name whose server or tool is gone or disabled.",
    ),
    ErrorCode(
        "mcp-tool-error",
        "The remote MCP tool itself reported a failure.",
        "The server answered the call with isError.",
    ),
    ErrorCode(
        "internal-error",
        "The runtime failed around the call.",
        "A fault in the runtime itself (not the ability); details in the log.",
    ),
    ErrorCode(
        "overloaded",
        "The runtime refused the call because a queue is full.",
        "Too many calls in flight; retry later.",
    ),
    ErrorCode(
        "model-unreachable",
        "The language model could not be reached or was overloaded.",
        "Connection refused or dropped, a timeout, HTTP 429 or 5xx; retried with backoff first.",
    ),
    ErrorCode(
        "model-rejected",
        "The language model's server refused the request.",
        "An HTTP 4xx other than 429 (a bad key, an unknown model, a request too large).",
    ),
    ErrorCode(
        "model-bad-response",
        "The language model's server answered with something that is not its wire format.",
        "A body or stream line that is not JSON or lacks the expected fields.",
    ),
    ErrorCode(
        "model-retry",
        "A model request failed and is being retried.",
        "Shown to the user while a 429, 5xx or dropped connection is retried.",
    ),
    ErrorCode(
        "queue-full",
        "Too many messages wait behind the running turn.",
        "A message sent while conversations.max_queued others wait; it is not run.",
    ),
    ErrorCode(
        "quota-exceeded",
        "This agent token keeps as much as it may already.",
        "An agent's message past conversations.agent_max_conversations or "
        "conversations.agent_max_bytes stored; it is not stored or run.",
    ),
    ErrorCode(
        "disk-full",
        "The disk is nearly full: no new work is taken.",
        "Less than conversations.min_free_bytes free where the data directory is; the "
        "message is not stored or run.",
    ),
    ErrorCode(
        "unknown-conversation",
        "No conversation has that id.",
        "show, delete or events named a conversation that does not exist.",
    ),
    ErrorCode(
        "unknown-channel",
        "No channel has that name.",
        "A message named a channel neither shipped nor configured.",
    ),
    ErrorCode(
        "invalid-message",
        "A conversation request is malformed, oversized or hostile.",
        "An empty or oversized text, a bad id, a channel mismatch, an unknown answer.",
    ),
    ErrorCode(
        "malformed-frame",
        "A chat frame is not a JSON or msgpack object.",
        "A chat client sent bytes that do not decode, or a frame that is not an object.",
    ),
    ErrorCode(
        "oversized-frame",
        "A chat frame is larger than chat.max_frame_bytes.",
        "A chat client sent a frame past the limit (far past it, the connection is closed).",
    ),
    ErrorCode(
        "unknown-kind",
        "A chat frame's type is not one the protocol knows.",
        "A chat client sent a frame whose type is not open, send, cancel, answer, close or ping.",
    ),
    ErrorCode(
        "invalid-frame",
        "A chat frame of a known kind has missing, extra or out-of-range fields.",
        "A chat frame failed the protocol's type for its kind.",
    ),
    ErrorCode(
        "origin-not-allowed",
        "The browser origin is not in the allow-list.",
        "A WebSocket upgrade whose Origin is not in chat.origins (HTTP 403).",
    ),
    ErrorCode(
        "too-many-clients",
        "The chat bridge serves its maximum number of clients.",
        "A new chat client past chat.max_clients (HTTP 503 on the WebSocket).",
    ),
    ErrorCode(
        "too-many-conversations",
        "The chat client has too many conversations open.",
        "An open or send past chat.max_open_conversations for one client.",
    ),
    ErrorCode(
        "slow-client",
        "The chat client did not read its frames and was disconnected.",
        "A client's outbox reached chat.send_queue frames.",
    ),
    ErrorCode(
        "chat-unavailable",
        "The conversations service did not answer the chat bridge.",
        "The service is restarting, stopping or did not answer in time; retry.",
    ),
    ErrorCode(
        "unauthorized",
        "The request carried no valid bearer token.",
        "Inbound MCP or the chat WebSocket: no, a bad, unknown or revoked token (HTTP 401).",
    ),
    ErrorCode(
        "rate-limited",
        "A per-token limit was reached; retry after the time given.",
        "Inbound MCP: requests per minute or concurrent turns past the token's limit (HTTP 429).",
    ),
    ErrorCode(
        "body-too-large",
        "The request body is over the size limit.",
        "Inbound MCP: a body over mcp_server.max_body_bytes (HTTP 413).",
    ),
    ErrorCode(
        "invalid-arguments",
        "Arguments of an inbound call are invalid; every bad field is listed.",
        "talk_to_chalie with missing, mistyped or out-of-range fields.",
    ),
    ErrorCode(
        "unknown-session",
        "No MCP session with that id belongs to this token.",
        "Inbound MCP: a session id another token opened, or one already reaped (HTTP 404).",
    ),
    ErrorCode(
        "mcp-auth-failed",
        "A remote MCP server refused Chalie's credentials.",
        "The named server answered HTTP 401 or 403 (a missing, wrong or revoked token).",
    ),
    ErrorCode(
        "mcp-tool-quarantined",
        "A remote MCP tool changed its definition since it was approved.",
        "Its name, description or input schema differs from the pinned one; the operator "
        "must run chalie mcp approve.",
    ),
    ErrorCode(
        "blocked-address",
        "The SSRF guard refused the destination: it is not a public address.",
        "A URL, a redirect or a browser request whose host is or resolves to loopback, private, "
        "link-local, unique-local, metadata or another non-public address not listed in [web] "
        "allow; or a scheme other than http(s).",
    ),
    ErrorCode(
        "fetch-failed",
        "The page could not be fetched.",
        "A name that does not resolve, a refused connection, a TLS failure, or an HTTP error "
        "status.",
    ),
    ErrorCode(
        "fetch-timeout",
        "The page did not arrive in time.",
        "The response was not complete within web.fetch_timeout seconds.",
    ),
    ErrorCode(
        "fetch-busy",
        "Too many fetches to that site are running already.",
        "At most 4 fetches to one scheme, host and port run at once (a slow site cannot hold "
        "every fetch); one more is refused at once.",
    ),
    ErrorCode(
        "fetch-too-large",
        "The response is larger than the limit.",
        "The body passed web.max_bytes (counted as it arrives, whatever Content-Length said).",
    ),
    ErrorCode(
        "too-many-redirects",
        "The redirect chain is longer than the limit.",
        "More than web.max_redirects redirects, or a redirect loop.",
    ),
    ErrorCode(
        "unsupported-content",
        "The content is of a type the tool does not read.",
        "A content type other than HTML, PDF, plain text, Markdown or JSON, or a document that "
        "does not parse.",
    ),
    ErrorCode(
        "no-search-provider",
        "No web search provider is configured.",
        "search was called with no [web.search] provider; the hint says how to configure SearXNG, "
        "Brave or Tavily.",
    ),
    ErrorCode(
        "search-failed",
        "The search provider did not give results.",
        "The provider refused the key, rate-limited, failed, or answered something that is not its"
        " JSON.",
    ),
    ErrorCode(
        "path-not-allowed",
        "The file is not in a folder the tool may read.",
        "read with a path outside web.read_folders (after resolving symbolic links), or one that "
        "does not exist.",
    ),
    ErrorCode(
        "browser-unavailable",
        "The headless browser could not be used.",
        "Chromium or Playwright is missing, failed to start, or the browser pool is full.",
    ),
    ErrorCode(
        "browser-error",
        "A browser action failed.",
        "No page open, an element not found, or a page that did not load.",
    ),
    ErrorCode(
        "delegate-failed",
        "The delegate did not end with an answer.",
        "Its sub-turn ended on a guard, a model error or a cancel; the message says which.",
    ),
    ErrorCode(
        "account-unreachable",
        "A person's account (CalDAV, CardDAV, IMAP, SMTP, ICS) did not answer.",
        "Refused, dropped (even mid-fetch) or timed out, or the server failed (5xx); the "
        "message names the account.",
    ),
    ErrorCode(
        "auth-failed",
        "The account's server refused the stored credentials.",
        "A wrong or revoked password or app password (HTTP 401/403, IMAP NO LOGIN, SMTP 535).",
    ),
    ErrorCode(
        "unknown-account",
        "No account of the needed kind has that name, or none is set up.",
        "An account= the model named that chalie accounts list does not show, or no account yet.",
    ),
    ErrorCode(
        "account-bad-response",
        "The account's server answered something that is not its protocol.",
        "XML that does not parse, an answer over the size limit, a stored object that cannot "
        "be read.",
    ),
    ErrorCode(
        "item-not-found",
        "The event, contact, message or folder named does not exist.",
        "An id not (or no longer) in the account, or outside the account's own collections.",
    ),
    ErrorCode(
        "read-only-account",
        "The account cannot be written to.",
        "A create, update or delete on an ICS subscription.",
    ),
    ErrorCode(
        "service-unreachable",
        "A keyless web service an ability uses did not answer.",
        "Open-Meteo refused, timed out, failed or answered with something that is not its JSON.",
    ),
    ErrorCode(
        "unknown-place",
        "No place of that name was found.",
        "weather with a place the geocoding service does not know.",
    ),
    ErrorCode(
        "approval-pending",
        "The call waits for the owner's approval; it did not run.",
        "An inbound agent's call that needs approval with [mcp_server] park_asks on: the "
        "owner answers the stored request later.",
    ),
    ErrorCode(
        "forbidden",
        "The caller's principal may not do this.",
        "An agent token on the chat WebSocket, or anyone but the owner answering a "
        "permission request (chalie.wire.principals).",
    ),
    ErrorCode(
        "no-query-or-location",
        "recall requires either a query or a location.",
        "memory recall called with neither query= nor location=.",
    ),
    ErrorCode(
        "memory-not-found",
        "No memory with that id belongs to the caller.",
        "memory update or forget (or chalie memory show/forget) with an unknown id.",
    ),
    ErrorCode(
        "service-unavailable",
        "A runtime service the ability needs (memory, the scheduler) is not running.",
        "The memory or reminder ability was called where that service is not attached.",
    ),
    ErrorCode(
        "reminder-not-found",
        "No pending reminder with that id.",
        "reminder cancel (or chalie reminders cancel) with an unknown or finished id.",
    ),
    ErrorCode(
        "mcp-result-too-large",
        "A remote MCP server's answer was larger than [mcp] max_result_bytes; it was refused.",
        "A server answered a call with more than the configured bytes (default 8 MiB).",
    ),
)

KNOWN_CODES: Final[frozenset[str]] = frozenset(e.code for e in ERROR_CODES)


def is_valid_code(code: str) -> bool:
    """A code is kebab-case; abilities may add their own beyond the table."""
    return bool(CODE_PATTERN.match(code)) and len(code) <= 64


def rst_rows() -> str:
    """The table as reStructuredText list-table rows, for the README."""
    lines = []
    for e in ERROR_CODES:
        lines.append(f"   * - ``{e.code}``\n     - {e.meaning}\n     - {e.when}")
    return "\n".join(lines)
