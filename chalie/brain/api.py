"""The REST API's types: every request and every answer is one msgspec Struct, defined here once.

The OpenAPI document (:mod:`chalie.brain.openapi`) is derived from these types and the
operation table (:mod:`chalie.brain.operations`); the dashboard's pages render the same
answers. Strings that reach the daemon are bounded here, so a hostile or oversized field is a
400 with the reason before anything acts on it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from chalie.calls.trail import TrailCall
from chalie.conversation.requests import ID_PATTERN
from chalie.conversation.store import ConversationSummary
from chalie.discovery.cascade import MAX_ENTRIES, MAX_ENTRY_CHARS
from chalie.gate.policy import PERMISSION
from chalie.memory.records import Memory
from chalie.schedule.store import Reminder, Shown
from chalie.wire.mcp_names import SERVER_WILDCARD
from chalie.wire.messages import Answer, Channel, Id, TrailStatus
from chalie.wire.principals import Scope

Name = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
]
Short = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Text = Annotated[str, msgspec.Meta(max_length=200)]
# The policy's own rule (a permission, or a server's wildcard), so the schema says it exactly.
Permission = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=f"(?:{PERMISSION.pattern})|(?:{SERVER_WILDCARD.pattern})",
    ),
]
Setting = Literal["allow", "ask", "deny"]
Limit = Annotated[int, msgspec.Meta(ge=1, le=500)]
# A SQLite row id (a signed 64-bit integer).
RowId = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]

MAX_IMPORT_BYTES: Final = 64 * 1024


class Struct(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every request body and query: unknown fields are refused."""


class Reply(msgspec.Struct, kw_only=True):
    """Base of every answer."""


class Empty(Struct):
    pass


class ApiError(Reply):
    """Every refusal: a stable kebab-case code and one line for a person."""

    error: str
    message: str


# -- overview ---------------------------------------------------------------------------
class ActorView(Reply):
    id: str
    alive: bool
    restarts: int
    last_error: str | None = None
    started_at: float | None = None


class RemoteSummary(Reply):
    name: str
    status: str
    tools: int
    quarantined: int


class ErrorRow(Reply):
    id: int
    tool: str
    code: str | None
    channel: str
    conversation_id: str
    started_at: float


class Overview(Reply):
    pid: int
    version: str
    uptime: float
    memory_rss_bytes: int
    actors: list[ActorView]
    workers: dict[str, Any] | None = None
    mcp_server: dict[str, Any] | None = None
    remote_servers: list[RemoteSummary] = []
    pending_approvals: int = 0
    recent_errors: list[ErrorRow] = []
    sessions: int = 0


# -- approvals --------------------------------------------------------------------------
class Approval(Reply):
    request_id: str
    conversation_id: str
    channel: str
    tool: str
    permission: str
    act_summary: str
    params: dict[str, Any]
    expires_at: float
    # Who asked: the principal whose turn raised it, as the gate wrote it ("the owner, on
    # the chat channel"); the conversation's origin when the request has none.
    asked_by: str = ""
    # What the call reaches beyond Chalie (a sensitive call: email.send's recipients,
    # subject and body), shown first on the card; None: nothing leaves Chalie.
    reach: str | None = None
    # What the person should know besides the parameters, in words (how often a reminder
    # fires; that the conversation had read untrusted content first).
    notes: tuple[str, ...] = ()
    # A form to fill (a server's elicitation): the answer's JSON schema (AnswerBody.content).
    form: dict[str, Any] | None = None


class AnswerBody(Struct):
    answer: Answer
    content: dict[str, Any] | None = None  # a request with a form: its fields


class Answered(Reply):
    request_id: str
    answer: str


class HistoryQuery(Struct):
    limit: Limit = 50


class HistoryRow(Reply):
    id: int
    tool: str
    permission: str | None
    decision: str | None
    channel: str
    conversation_id: str
    status: str
    started_at: float
    # Who answered: a token's name, "the owner (local)" for the local owner; empty when
    # the request's answer is not on record (it expired, or was answered before it was kept).
    decided_by: str = ""


class ExchangeQuery(Struct):
    limit: Limit = 50


class ExchangeRow(Reply):
    """An agent's loop_in_human exchange, kept for the owner (chalie.mcp_server.kept)."""

    kept: int
    ts: float
    conversation_id: str
    phase: str
    summary: str  # chalie.mcp_server.exchange.summary: the one line every surface shows
    request_id: str = ""  # phase "permission": answered in Approvals while it is pending
    seen: bool = False  # an owner client has received it


# -- policy -----------------------------------------------------------------------------
class PolicyQuery(Struct):
    q: Text = ""
    channel: Channel | None = None
    setting: Literal["allow", "ask", "deny", "internal"] | None = None
    origin: Literal["set", "seen"] | None = None
    # The runtime's own rows (setting internal: find_tools and the like) are hidden from
    # the policy surface, as nobody decides them; true (or setting=internal) shows them.
    internal: bool = False


class PolicyRowView(Reply):
    channel: str
    permission: str
    decision: str
    origin: str
    updated_at: float
    read_only: bool = False


class PolicyPage(Reply):
    channels: list[str]
    rows: list[PolicyRowView]
    # Registered permissions no rule and no gate decision has touched yet.
    unconfigured: list[str]
    # Rows that matched but were left out because they are internal (PolicyQuery.internal).
    hidden_internal: int = 0


class PolicySet(Struct):
    channel: Channel
    permission: Permission
    decision: Setting


class PolicyReset(Struct):
    channel: Channel | None = None
    permission: Permission | None = None


class Removed(Reply):
    removed: int


# -- the MCP server and tokens ----------------------------------------------------------
class McpServerView(Reply):
    enabled: bool
    host: str
    port: int
    path: str
    url: str | None
    running: bool
    gateway: bool
    limits: dict[str, Any]


class McpServerChange(Struct):
    enabled: bool | None = None
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=255)] | None = None
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    gateway: bool | None = None


class TokenView(Reply):
    name: str
    scope: str
    created: float
    revoked: float | None = None
    last_used: float | None = None


class TokenCreate(Struct):
    name: Name
    scope: Scope = "agent"


class ClientConfigs(Reply):
    claude_desktop: str
    claude_code: str
    cursor: str


class CreatedToken(Reply):
    token: TokenView
    # Shown once: nothing stores it.
    secret: str
    configs: ClientConfigs


class NamePath(Struct):
    name: Name


# -- calling a tool from the dashboard --------------------------------------------------
class ToolInfo(Reply):
    name: str
    tooltip: str
    # The JSON Schema of its arguments, as a call may give them (the form is made from it).
    input_schema: dict[str, Any]


class ToolCallBody(Struct):
    # The arguments; a string value is read as typed text (chalie.calls.typed_text), as the
    # CLI's key=value and a form's fields are.
    arguments: dict[str, Any] = {}


class ToolCallResult(Reply):
    call_id: str
    conversation_id: str
    # done: the envelope is here; waiting: the gate is asking (answer it in Approvals),
    # and the result will be on the trail.
    state: Literal["done", "waiting"]
    status: str | None = None
    code: str | None = None
    envelope: str = ""
    # The call's row on the action trail (who called, the gate's decision, the time).
    trail: TrailEntry | None = None


# -- remote MCP servers -----------------------------------------------------------------
class RemoteView(Reply):
    name: str
    transport: str
    target: str
    enabled: bool
    status: str
    since: float | None = None
    reason: str | None = None
    last_heartbeat: float | None = None
    protocol: str | None = None
    latency_ms: float | None = None
    last_error: str | None = None
    tools: int = 0
    quarantined: int = 0


class LogQuery(Struct):
    lines: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


class RemoteLog(Reply):
    """A remote server's last log lines: its stderr, its log messages, its notifications."""

    name: str
    lines: list[str]


class RemoteAdd(Struct):
    name: Annotated[
        str, msgspec.Meta(min_length=1, max_length=24, pattern=r"^[a-z][a-z0-9-]{0,23}$")
    ]
    transport: Literal["stdio", "http", "sse"]
    url: Annotated[str, msgspec.Meta(max_length=2000)] = ""
    command: Annotated[str, msgspec.Meta(max_length=1000)] = ""
    args: list[Annotated[str, msgspec.Meta(max_length=1000)]] = []
    enabled: bool = True


class RemoteImport(Struct):
    text: Annotated[str, msgspec.Meta(min_length=2, max_length=MAX_IMPORT_BYTES)]
    replace: bool = False


class Imported(Reply):
    added: list[str]
    skipped_existing: list[str]
    problems: list[Any]


class RemoteToolView(Reply):
    proxy: str
    remote: str
    state: str
    description: str
    # Provenance: which server and since when.
    server: str
    first_seen: float
    updated_at: float
    changed: str = ""
    problem: str = ""
    # For a quarantined tool: a unified diff of description and schema, old to new.
    diff: str = ""


class ApproveBody(Struct):
    tool: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None


class ApprovedTools(Reply):
    name: str
    approved: list[str]


class RemoteDone(Reply):
    name: str
    detail: dict[str, Any] = {}


# -- trail ------------------------------------------------------------------------------
class TrailFilter(Struct):
    """The filters a trail page and a trail export share."""

    tool: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    status: TrailStatus | None = None
    code: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    channel: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    conversation: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    # The principal id of the turn (a token id, or ``local`` for the owner's local calls).
    principal: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    since: float | None = None
    until: float | None = None


class TrailQuery(TrailFilter):
    # Keyset pagination: rows with an id below this one (the previous page's next_before).
    before: RowId | None = None
    limit: Limit = 50


class UsageQuery(Struct):
    window: Literal["hour", "day"] = "hour"


class UsageRow(Reply):
    name: str
    calls: int
    errors: int
    error_rate: float
    p50_ms: float | None
    p95_ms: float | None


class UsageView(Reply):
    """Calls, errors and latency per tool and per remote server over the window."""

    window: str
    since: float
    tools: list[UsageRow]
    servers: list[UsageRow]


class TrailExportQuery(TrailFilter):
    format: Literal["jsonl", "csv"] = "jsonl"


# The stored row's fields an operator is shown, declared once in chalie.calls.trail (frozen there,
# so not a Reply: a frozen struct cannot also derive from a mutable one).
class TrailEntry(TrailCall, frozen=True):
    """One tool call on the action trail."""


class TrailPage(Reply):
    rows: list[TrailEntry]
    next_before: int | None


# -- accounts ---------------------------------------------------------------------------
class AccountRow(Reply):
    """One account as shown: never a password (only whether one is stored)."""

    name: str
    kind: str
    default: bool
    # Where the server is: a URL without credentials, or host:port.
    server: str
    security: str = ""
    username: str = ""
    address: str = ""
    password_stored: bool = False


# -- conversations ----------------------------------------------------------------------
class ConversationsQuery(Struct):
    limit: Limit = 50


# The fields declared once in chalie.conversation.store (frozen there, so not a Reply).
class ConversationRow(ConversationSummary, frozen=True):
    """One conversation as listed."""


class ConversationPath(Struct):
    conversation_id: Annotated[str, msgspec.Meta(pattern=ID_PATTERN.pattern)]


class ConversationView(Reply):
    conversation_id: str
    detail: dict[str, Any]


class Deleted(Reply):
    conversation_id: str
    deleted: bool


# -- discovery --------------------------------------------------------------------------
class DiscoveryTry(Struct):
    # The entries, as find_tools takes them.
    queries: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ENTRY_CHARS)]],
        msgspec.Meta(min_length=1, max_length=MAX_ENTRIES),
    ]


class ExamplesQuery(Struct):
    tool: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None


class DiscoveryHit(Reply):
    name: str
    distance: float | None = None


class DiscoveryEntry(Reply):
    """How one query entry was answered: the rung that yielded, its names, best first."""

    query: str
    rung: str
    hits: list[DiscoveryHit]
    candidates: list[str] = []


class DiscoveryAnswer(Reply):
    entries: list[DiscoveryEntry]
    injected: list[str]


class ExampleView(Reply):
    id: int
    tool: str
    text: str
    channel: str
    created: float


class ExamplePath(Struct):
    id: RowId


class Forgotten(Reply):
    forgotten: int


class RequestPath(Struct):
    request_id: Id


# -- memory -----------------------------------------------------------------------------
# Whose memories: ``owner``, or ``agent:<token id>`` (chalie.memory.whose).
MemoryKey = Annotated[
    str, msgspec.Meta(min_length=1, max_length=140, pattern=r"^(?:owner|agent:[A-Za-z0-9_.:?-]+)$")
]


class MemoriesQuery(Struct):
    principal: MemoryKey | None = None
    limit: Limit = 50


class MemoryView(Memory, frozen=True, kw_only=True):
    """One memory as its store keeps it (:class:`chalie.memory.records.Memory`: provenance,
    ``untrusted`` naming the untrusted sources, web pages, mail, remote tools, that the storing
    conversation had read), with what the page adds: ``agent``, the agent's token name for an
    agent's memory ("" for the owner's, "?" if unknown), and ``score``, its rank in a search."""

    agent: str
    score: float | None = None


class MemoryGroup(Reply):
    principal: str
    agent: str
    count: int
    memories: list[MemoryView]


class MemoriesPage(Reply):
    """The owner's memories first, then each agent's, apart."""

    groups: list[MemoryGroup]


class MemorySearch(Struct):
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)] | None = None
    location: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    principal: MemoryKey = "owner"
    limit: Annotated[int, msgspec.Meta(ge=1, le=50)] = 10


class MemoryPath(Struct):
    id: RowId


class ForgottenQuery(Struct):
    """The forgotten memories still restorable, the latest forgotten first."""

    limit: Limit = 50


class MemoryForgotten(Reply):
    id: int
    forgotten: bool


# -- reminders --------------------------------------------------------------------------
class RemindersQuery(Struct):
    # pending: still to fire; fired: fired at least once (newest first); late: its last firing
    # was late (Chalie was down when it was due).
    view: Shown = "pending"
    limit: Limit = 100


class ReminderView(Reminder, frozen=True, kw_only=True):
    """One reminder as its store keeps it (:class:`chalie.schedule.store.Reminder`), with
    ``agent``: the agent's token name for an agent's reminder ("" for the owner's)."""

    agent: str


class ReminderPath(Struct):
    id: RowId
