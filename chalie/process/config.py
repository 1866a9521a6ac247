"""The configuration: one msgspec type, :class:`Config`, whose fields are the keys of config.toml.

Every key has a type and a range, and its default lives here only. A key the
type does not know, a value of the wrong type or out of range, is one line
naming the file, the key, the value and what is allowed (:class:`ConfigError`),
raised before anything starts.

A feature adds its own ``[section]`` as one nested :class:`Section` subclass
with defaults, defined in this module, and one field on :class:`Config`::

    class McpServerConfig(Section, frozen=True):
        port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0

    class Config(Section, frozen=True):
        ...
        mcp_server: McpServerConfig = McpServerConfig()
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
import msgspec.inspect as mi

from chalie.net.loopback import HOST, is_loopback
from chalie.net.ssrf import AllowEntry
from chalie.process.home import ABILITIES_ENV_VAR, ENV_VAR, Home
from chalie.store.store_place import Place, check_url, place_for
from chalie.wire.messages import Channel

__all__ = [
    "AccountsConfig",
    "BackgroundConfig",
    "BrainConfig",
    "ChatConfig",
    "Config",
    "ConfigError",
    "DiscoveryConfig",
    "EmbedderBackend",
    "EmbedderConfig",
    "McpConfig",
    "McpServerConfig",
    "MemoryConfig",
    "OutboxConfig",
    "RayTaskConfig",
    "Section",
    "TelemetryConfig",
    "WeatherConfig",
    "WebConfig",
    "WorkersConfig",
]


CONFIG_SOURCE: Final = "config.toml"


class ConfigError(ValueError):
    """``config.toml`` cannot be used; the message is the one line the operator sees."""


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the configuration and of each of its ``[sections]``: unknown keys are errors."""


# -- [embedder] --------------------------------------------------------------------------

EmbedderBackend = Literal["onnx", "e5-multilingual", "sentence-transformers", "openai"]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
HttpUrl = Annotated[str, msgspec.Meta(pattern=r"^https?://\S+$", max_length=2048)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class EmbedderConfig(Section, frozen=True):
    """Discovery's embedding model (default: MiniLM int8 ONNX, offline)."""

    # Which model: onnx (MiniLM, offline), e5-multilingual, sentence-transformers, openai.
    backend: EmbedderBackend = "onnx"
    # Threads for one query inside the local model (default: up to 2). 1 is quicker where a
    # local language model keeps a core busy (2 cores beside llama-server: 10-12 ms a query
    # on 1 thread, 12-14 on 2); 2 where a core is free (3.5 ms against 4.6).
    threads: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    model: ModelName | None = None  # sentence-transformers: a path or name; openai: the model
    url: HttpUrl | None = None  # openai: the endpoint's base URL
    api_key_env: EnvName | None = None  # openai: the NAME of the variable holding the key
    # A local model is loaded on the first find and released after this many
    # seconds without one (0: kept once loaded).
    idle_unload: Annotated[float, msgspec.Meta(ge=0.0, le=86400.0)] = 600.0

    def __post_init__(self) -> None:
        if self.backend == "sentence-transformers" and self.model is None:
            raise ValueError("the sentence-transformers backend needs embedder.model")
        if self.backend == "openai" and (self.url is None or self.model is None):
            raise ValueError("the openai backend needs embedder.url and embedder.model")

    def options(self) -> dict[str, Any]:
        """The model's set keys as a plain mapping, as ``load_embedder`` takes them."""
        return {
            k: v
            for k, v in msgspec.structs.asdict(self).items()
            if v is not None and k != "idle_unload"
        }


# -- [chat] ------------------------------------------------------------------------------

Z85Key = Annotated[str, msgspec.Meta(pattern=r"^[0-9A-Za-z.:+=^!/*?&<>()\[\]{}@%$#-]{40}$")]


class ChatConfig(Section, frozen=True):
    """The chat bridges: WebSocket (bearer token) and ZeroMQ (local ipc; TCP only with CURVE)."""

    # Run the chat bridges at all.
    enabled: bool = True
    # Serve the WebSocket transport (the local ZeroMQ one runs whenever chat does).
    websocket: bool = True
    # The WebSocket's address (loopback unless allow_remote).
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=255)] = HOST
    # The WebSocket's TCP port (0: any free port).
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8461
    # The WebSocket's URL path.
    path: Annotated[str, msgspec.Meta(pattern=r"^/[A-Za-z0-9/_-]{0,99}$")] = "/chat"
    # A host beyond loopback must be allowed explicitly (and is logged as a warning).
    allow_remote: bool = False
    # Browser origins that may connect; a client sending no Origin is not a browser.
    origins: list[Annotated[str, msgspec.Meta(pattern=r"^https?://\S+$")]] = []
    # Optional ZeroMQ over TCP (e.g. "tcp://0.0.0.0:8463"): only with CURVE.
    zmq_tcp: Annotated[str, msgspec.Meta(pattern=r"^tcp://\S+$")] | None = None
    curve_secret_key_file: Path | None = None  # a zmq.auth secret certificate file
    curve_authorized_keys: list[Z85Key] = []  # clients' public keys (Z85)
    # The largest frame a client may send, in bytes.
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1024, le=16 * 1024 * 1024)] = 256 * 1024
    # Frames queued for one client that does not read before it is dropped.
    send_queue: Annotated[int, msgspec.Meta(ge=4, le=100_000)] = 1024
    # Clients connected at once.
    max_clients: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 2048
    # HTTP connections the WebSocket listener holds (within its share of the descriptors,
    # chalie.net.admission); past it the oldest one with an unfinished request is closed.
    max_connections: Annotated[int, msgspec.Meta(ge=16, le=100_000)] = 512
    # Seconds a request's headers may take to arrive before the connection is closed.
    request_timeout: Annotated[float, msgspec.Meta(ge=0.05, le=3_600.0)] = 10.0
    # Conversations one client may have open at once.
    max_open_conversations: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 64
    # A ZeroMQ client silent this long is forgotten (`chalie chat` pings well within it).
    idle_timeout: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 300.0
    # A WebSocket client's token is checked again this often: a revoked one is disconnected.
    token_recheck: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 30.0

    def __post_init__(self) -> None:
        if not is_loopback(self.host) and not self.allow_remote:
            raise ValueError(f"chat.host {self.host} is not loopback: set chat.allow_remote = true")
        if self.zmq_tcp is not None and (
            self.curve_secret_key_file is None or not self.curve_authorized_keys
        ):
            raise ValueError(
                "chat.zmq_tcp needs chat.curve_secret_key_file and chat.curve_authorized_keys"
                " (no TCP without CURVE)"
            )


# -- [brain] -----------------------------------------------------------------------------


class BrainConfig(Section, frozen=True):
    """The Brain dashboard (/brain/) and REST API (/api/v1/) on the chat web server."""

    # Serve the dashboard and the REST API beside the chat WebSocket.
    enabled: bool = True
    # A signed-in browser stays signed in this long (and no longer than its token).
    session_ttl: Annotated[float, msgspec.Meta(ge=60.0, le=30 * 86_400.0)] = 8 * 3600.0
    # A `chalie brain open` link must be used within this many seconds.
    link_ttl: Annotated[float, msgspec.Meta(ge=5.0, le=3600.0)] = 120.0


# -- [mcp_server] ------------------------------------------------------------------------

HostName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:\[\]_-]+$")
]


class McpServerConfig(Section, frozen=True):
    """The inbound MCP server (talk_to_chalie) and its per-token limits."""

    # Run the inbound MCP server.
    enabled: bool = True
    # The address it binds (loopback unless allow_remote).
    host: HostName = HOST
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8462  # 0: any free port
    # Binding beyond loopback needs this too, and is logged as a warning.
    allow_remote: bool = False
    # Extra Host / Origin values the DNS-rebinding guard accepts (for a remote bind).
    allowed_hosts: tuple[HostName, ...] = ()
    # Extra Origin values the DNS-rebinding guard accepts.
    allowed_origins: tuple[Annotated[str, msgspec.Meta(max_length=2048)], ...] = ()
    # Per token: turns running at once, HTTP requests per minute, bytes per request.
    max_concurrent_turns: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 4
    # HTTP requests per minute, per token.
    requests_per_minute: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 600
    # The largest request body, in bytes.
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1_024, le=16_777_216)] = 262_144
    # Stateful (2025-11-25) sessions, all tokens together, and their idle reaping.
    max_sessions: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1_000
    # One token's share of them: no token can take every session (the others would get 503).
    max_sessions_per_token: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 64
    # HTTP connections held at once (within the listener's share of the descriptors,
    # chalie.net.admission); past it the oldest one with an unfinished request is closed.
    max_connections: Annotated[int, msgspec.Meta(ge=16, le=100_000)] = 512
    # Seconds a request's headers and body may take to arrive before it is closed.
    request_timeout: Annotated[float, msgspec.Meta(ge=0.05, le=3_600.0)] = 30.0
    # Seconds an idle stateful session is kept.
    session_idle_timeout: Annotated[float, msgspec.Meta(ge=1.0, le=86_400.0)] = 600.0
    # A turn that never reports its end is given up (and cancelled) after this long.
    turn_wait: Annotated[float, msgspec.Meta(ge=1.0, le=86_400.0)] = 900.0
    # Gateway mode: tokens created with --gateway may call find_tools and the tools it
    # finds directly, gated on the external_agent channel.
    gateway: bool = False
    # loop_in_human asks: on a talk_to_chalie turn with loop_in_human while a chat client
    # is connected, an `ask` becomes a permission request to that person (not a deny).
    loop_in_human_asks: bool = False
    # Park and resume: an agent's call that needs approval is not a flat deny; the agent
    # hears it waits for the owner (request id, question), the owner answers from chat or
    # the CLI, and the agent's next talk_to_chalie in that conversation gets the outcome.
    park_asks: bool = False


# -- [models.NAME], [channels.NAME], [conversations]: the conversation runtime ----------

Seconds = Annotated[float, msgspec.Meta(ge=0.001, le=86400.0)]


# The wire format a model server speaks (chalie.providers.formats: one class each).
ProviderKind = Literal["openai", "ollama", "anthropic"]


class ModelConfig(Section, frozen=True):
    """One language model, ``[models.NAME]``; ``[models.default]`` serves unnamed channels."""

    # The wire format the model server speaks: openai, ollama or anthropic.
    provider: ProviderKind = "openai"
    # The model server's base URL.
    base_url: HttpUrl = f"http://{HOST}:11434/v1"
    # The model's name on that server.
    model: ModelName = "llama3.1"
    # The NAME of the environment variable holding the key; the key itself is never stored.
    api_key_env: EnvName | None = None
    # Tokens the model reads at once: the turn's context budget.
    context_window: Annotated[int, msgspec.Meta(ge=256, le=100_000_000)] = 32768
    # Tokens one answer may have.
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 4096
    # Stream answers (text reaches the clients as it is written).
    stream: bool = True
    # Seconds to connect to the model server.
    connect_timeout: Seconds = 10.0
    # Seconds without a byte from the model before the request counts as hung.
    read_timeout: Seconds = 120.0
    # Retries of a 429, 5xx, refused or dropped request, with exponential backoff.
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    # Seconds before the first retry, doubled for each next one.
    backoff: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 0.5
    # A tool call the model wrote as text (bare JSON, a ```json fence, <tool_call> tags)
    # is read as the call; "auto": on for the openai and ollama wires.
    tool_call_rescue: Literal["auto", "off"] = "auto"
    # After a call repeats one that succeeded, the model gets the earlier result with a
    # note to answer, and (openai and ollama wires) its next request carries no tools.
    answer_nudge: Literal["auto", "off"] = "auto"
    # Before the first request of a turn on a channel with find_tools, the framework runs
    # find_tools on the person's message and offers the tools that clearly fit at step one
    # (a framework seed, through the dispatcher); "auto": on for the openai and ollama wires.
    seed_tools: Literal["auto", "off"] = "auto"
    # A final text that is only markup, a tool's schema or a tool call described in words
    # is not taken as the answer: the model is asked once more, and after a successful
    # call it is asked to answer with the result; "auto": on for the openai and ollama wires.
    answer_check: Literal["auto", "off"] = "auto"
    # On a channel with a human, what memory holds that bears on the message goes before
    # it in the turn's requests (chalie.memory.briefing.for_turn). Off by default: with the
    # 1.5B model the brief's clock line and loosely related memories (a small book's every
    # memory passes the relevance floor) turned time questions into conversions.
    memory_brief: Literal["on", "off"] = "off"
    # Each step that offers tools is held to one JSON object (the server's JSON-schema
    # output): a call of an offered tool with arguments of its schema, or the answer
    # (chalie.providers.steps), so a call cannot be narrated nor an answer be markup.
    # "auto": on for the openai and ollama wires when the model server runs on this
    # machine (llama.cpp, Ollama, LM Studio); "on": also for a server elsewhere.
    structured_steps: Literal["auto", "on", "off"] = "auto"
    # The sampling temperature of a structured step (which tool, its arguments, or the
    # answer); "server": the server's own. At the 0.7 the small models' servers are
    # run with, the 1.5B model's choices wandered (memory called for "Do I have any
    # meetings today?" with the calendar offered); at 0 they did not.
    step_temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | Literal["server"] = 0.0
    # How a step's tools reach the model: "native" in the request's tools (the chat
    # template renders each tool's whole JSON schema), "compact" as one line a tool at the
    # end of the system prompt (chalie.providers.signatures: about a third of the tokens);
    # "auto": compact where steps are structured (the grammar carries the exact schemas).
    tool_listing: Literal["auto", "native", "compact"] = "auto"


ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class ChannelConfig(Section, frozen=True):
    """Overrides of one channel, ``[channels.NAME]``; an unset key keeps the shipped value."""

    # A person answers this channel's permission requests.
    human_present: bool | None = None
    # The permission table's channel its calls are gated on.
    policy_channel: Channel | None = None
    # Tools always callable on this channel, without find_tools.
    pinned: tuple[ToolName, ...] | None = None
    # Offer find_tools, so a turn can activate more tools.
    find_tools: bool | None = None
    # Offer the async flag: calls may run in the background.
    async_offered: bool | None = None
    # Model steps one turn may take (guard-steps).
    max_steps: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    # Repeats of the same tool call that end the turn (guard-repeat).
    max_repeat: Annotated[int, msgspec.Meta(ge=2, le=100)] | None = None
    # Seconds one turn may run (guard-time).
    wall_clock: Seconds | None = None
    # Tokens one turn may spend (guard-tokens).
    token_budget: Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] | None = None
    # The system prompt of this channel's turns.
    system_prompt: Annotated[str, msgspec.Meta(max_length=100_000)] | None = None
    # The [models.NAME] this channel's turns use.
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None


class ConversationsConfig(Section, frozen=True):
    # Seconds a conversation's actor stays after its last activity.
    idle_stop: Seconds = 600.0
    # The longest user message, in characters.
    max_message_chars: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 100_000
    # User messages waiting behind a running turn, per conversation.
    max_queued: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 16
    # Conversation actors kept in memory (a thread each). Past this, the least recently
    # used idle ones are stopped at once, as idle_stop would later; their conversations
    # stay stored and come back on their next message.
    max_live: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 256
    # The conversations one agent token may keep: past it (or agent_max_bytes), its new
    # messages are refused (quota-exceeded) until the owner deletes some. The owner has
    # no quota.
    agent_max_conversations: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 1000
    # The bytes of conversations one agent token may keep (quota-exceeded past it).
    agent_max_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 50)] = 64 * 1024 * 1024
    # Days an agent token's conversation is kept after its last message; 0: until deleted.
    # Checked at start and every hour. The owner's conversations are never pruned.
    agent_retention_days: Annotated[float, msgspec.Meta(ge=0, le=36_500)] = 0.0
    # Free space the data directory's disk must keep: below it every new message is
    # refused (disk-full), before a full disk stops the daemon.
    min_free_bytes: Annotated[int, msgspec.Meta(ge=0, le=1 << 60)] = 256 * 1024 * 1024


class DiscoveryConfig(Section, frozen=True):
    """``[discovery]``: learning from use (chalie/discovery/learning.py)."""

    # Record the find_tools entries that led to a successful call as examples.
    learn: bool = True
    # Only where a human is present by default: an external agent must not teach
    # discovery to route other people's requests.
    learn_channels: tuple[Channel, ...] = ("chat",)
    # Learned examples kept per tool.
    examples_per_tool: Annotated[int, msgspec.Meta(ge=1, le=200)] = 20
    # Tools that arrive without examples (remote MCP tools) get some written by
    # [models.default] in the background; nothing happens without that model.
    write_examples: bool = True
    # Tools a minute the model is asked to write examples for.
    write_budget_per_minute: Annotated[int, msgspec.Meta(ge=1, le=600)] = 10


# The outbox's limits (chalie.calls.outbox reads its defaults here).
OUTBOX_MAX_AGE: Final = 7 * 24 * 3600.0
OUTBOX_MAX_ROWS: Final = 10_000


class OutboxConfig(Section, frozen=True):
    """``[outbox]``: background results kept until their conversation acknowledges them."""

    # Seconds an undelivered result is kept (1 minute to 90 days).
    max_age: Annotated[float, msgspec.Meta(ge=60.0, le=90 * 86400.0)] = OUTBOX_MAX_AGE
    # Undelivered results kept at most; past it the oldest are dropped first.
    max_rows: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = OUTBOX_MAX_ROWS


# -- [web]: fetching, reading, searching and browsing for the web delegates ------------

SearchProvider = Literal["searxng", "brave", "tavily"]


class WebSearchConfig(Section, frozen=True):
    """``[web.search]``: the provider ``search`` asks (none: search says how to set one)."""

    # The search provider: searxng, brave or tavily (none: no search).
    provider: SearchProvider | None = None
    # SearXNG: the instance's base URL (its JSON format must be enabled). Brave and
    # Tavily have their public endpoints as defaults; set url to use another.
    url: HttpUrl | None = None
    # The NAME of the environment variable holding the key (Brave, Tavily), else the
    # secret ``web.search`` in the secrets store; the key never reaches the model.
    api_key_env: EnvName | None = None
    # Results one search returns at most.
    max_results: Annotated[int, msgspec.Meta(ge=1, le=50)] = 8
    # Seconds one search may take.
    timeout: Annotated[float, msgspec.Meta(gt=0, le=120)] = 15.0

    def __post_init__(self) -> None:
        if self.provider == "searxng" and self.url is None:
            raise ValueError("web.search.provider searxng needs web.search.url")


class BrowserConfig(Section, frozen=True):
    """``[web.browser]``: the headless Chromium the ``browser`` tool drives."""

    # The Chromium binary the browser tool starts.
    executable: Path = Path("/usr/bin/chromium")
    # Pages (one per delegate turn) open at once; a turn past it gets browser-unavailable.
    max_sessions: Annotated[int, msgspec.Meta(ge=1, le=32)] = 2
    # Seconds a turn's page stays open after its last action.
    session_idle: Annotated[float, msgspec.Meta(ge=0.1, le=3600)] = 120.0
    # Seconds the browser process stays up with no page open (then it is closed).
    idle_close: Annotated[float, msgspec.Meta(ge=0.1, le=86400)] = 60.0
    # Seconds one browser action may take.
    action_timeout: Annotated[float, msgspec.Meta(gt=0, le=300)] = 15.0
    # Requests one page makes at once (its images, scripts, XHR...); the rest wait their
    # turn, so one page's slow sites never hold another page's requests.
    page_fetches: Annotated[int, msgspec.Meta(ge=1, le=64)] = 6


class WebConfig(Section, frozen=True):
    """``[web]``: the SSRF guard's allow-list, fetch limits, readable folders, search, browser."""

    # Destinations the SSRF guard admits although they are not public: an address, a
    # network or a host name, each maybe with :port ("127.0.0.1:8080", "192.168.1.0/24").
    allow: tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=300)], ...] = ()
    # Seconds a fetch may take, from connect to the last byte (fetch-timeout).
    fetch_timeout: Annotated[float, msgspec.Meta(gt=0, le=300)] = 20.0
    # The largest response body a fetch reads, in bytes (fetch-too-large).
    max_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1_073_741_824)] = 10 * 1024 * 1024
    # Redirects one fetch follows (too-many-redirects).
    max_redirects: Annotated[int, msgspec.Meta(ge=0, le=30)] = 5
    # Characters of extracted text one result hands the model (the rest is cut, and said so).
    max_text_chars: Annotated[int, msgspec.Meta(ge=500, le=2_000_000)] = 40_000
    # Folders ``read`` may open files in (none: only fetched files and attachments).
    read_folders: tuple[Path, ...] = ()
    # The User-Agent header of fetches.
    user_agent: Annotated[str, msgspec.Meta(min_length=1, max_length=300)] = (
        "Mozilla/5.0 (compatible; Chalie/0.1; +https://chalie.invalid/bot)"
    )
    search: WebSearchConfig = WebSearchConfig()
    browser: BrowserConfig = BrowserConfig()

    def __post_init__(self) -> None:
        for entry in self.allow:
            AllowEntry.parse(entry)  # ValueError: the one line names the entry


class MemoryConfig(Section, frozen=True):
    """``[memory]``: the memory ability (chalie/memory). Memories are the owner's."""

    # Agent token names allowed to recall the owner's memories ("*": every agent).
    # An agent always recalls what it stored itself, and only that otherwise.
    agents_may_recall: tuple[
        Annotated[str, msgspec.Meta(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")], ...
    ] = ()


class BackgroundConfig(Section, frozen=True):
    """``[background]``: the scheduler's passes (reminders, reflection) and compaction."""

    # Reminders fire (a turn on the subconscious channel); off: they wait, pending.
    reminders: bool = True
    # The shortest time between two firings of a recurring reminder, in seconds.
    reminder_min_interval: Annotated[float, msgspec.Meta(ge=1.0, le=86400.0)] = 60.0
    # Pending reminders one principal (the owner, or one agent token) may have.
    reminders_per_principal: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 100
    # Reminder turns all reminders together may start in one UTC day; past it a due
    # reminder is delivered as written, without a model turn.
    reminder_turns_per_day: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 200
    # Reflection passes: an idle chat conversation is read once by [models.default] for
    # what in it is worth remembering. The one key that turns them off.
    reflection: bool = True
    # Seconds a chat conversation idles before its reflection pass.
    reflection_idle: Annotated[float, msgspec.Meta(ge=1.0, le=30 * 86400.0)] = 1800.0
    # Model tokens all reflection passes together may spend in one UTC day.
    reflection_tokens_per_day: Annotated[int, msgspec.Meta(ge=0, le=1_000_000_000)] = 50_000
    # When a conversation's history no longer fits, summarise the oldest turns instead of
    # only dropping them (the summary is stored; the originals stay in storage).
    compaction: bool = True


# -- [workers]: where abilities with isolation = "process" run -------------------------

# Where worker abilities run: "local" (the daemon's own ZeroMQ worker processes) or "ray".
WorkerEngine = Literal["local", "ray"]
# A Ray cluster: "local" (start one in the daemon, for tests), "auto" (the one `ray start`
# made on this host), "HOST:PORT" (its GCS) or "ray://HOST:PORT" (Ray Client).
RayAddress = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(local|auto|ray://[A-Za-z0-9.\[\]:_-]+|[A-Za-z0-9.\[\]_-]+:[0-9]{1,5})$",
        max_length=300,
    ),
]
# A custom Ray resource a node advertises (`ray start --resources '{"chromium": 1}'`).
RayResourceName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]
# Ray's own resource names: asked for through num_cpus, num_gpus and memory instead.
RAY_BUILTIN_RESOURCES: Final = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


class RayTaskConfig(Section, frozen=True):
    """``[workers.abilities.NAME]``: what one ability's call asks of the Ray cluster."""

    # CPUs one call holds on its node while it runs.
    num_cpus: Annotated[float, msgspec.Meta(ge=0.0, le=1024.0)] = 1.0
    # GPUs one call holds on its node while it runs.
    num_gpus: Annotated[float, msgspec.Meta(ge=0.0, le=64.0)] = 0.0
    # Bytes of memory one call reserves on its node (none: no reservation).
    memory: Annotated[int, msgspec.Meta(ge=1, le=1 << 50)] | None = None
    # Custom resources a node must offer, e.g. { chromium = 1 } for a host with Chromium.
    resources: dict[RayResourceName, Annotated[float, msgspec.Meta(gt=0.0, le=1e6)]] = {}

    def __post_init__(self) -> None:
        builtin = sorted(RAY_BUILTIN_RESOURCES.intersection(self.resources))
        if builtin:
            raise ValueError(
                f"resources may not name Ray's own {', '.join(builtin)}:"
                " use num_cpus, num_gpus or memory"
            )


class WorkersConfig(Section, frozen=True):
    """``[workers]``: how abilities with isolation = "process" run (``workers = N`` is count)."""

    # Worker processes of the local engine; each is a Python process.
    count: Annotated[int, msgspec.Meta(ge=1, le=32)] = 2
    # Where worker abilities run: "local" (the daemon's worker processes) or "ray".
    engine: WorkerEngine = "local"
    # The Ray cluster (engine = "ray"): "local", "auto", "HOST:PORT" or "ray://HOST:PORT".
    address: RayAddress | None = None
    # The Ray namespace the daemon's tasks run in.
    namespace: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = "chalie"
    # CPUs of the cluster address = "local" starts inside the daemon.
    local_cpus: Annotated[int, msgspec.Meta(ge=1, le=256)] = 2
    # Ship the drop-in folder to the cluster (the Ray job's runtime_env working_dir, uploaded
    # once when the daemon joins), so a host that has never seen the folder runs its abilities.
    ship_dropins: bool = True
    # Per ability: the resources its calls ask of the cluster (default: one CPU).
    abilities: dict[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], RayTaskConfig] = {}

    def __post_init__(self) -> None:
        if self.engine == "ray" and self.address is None:
            raise ValueError(
                'workers.engine = "ray" needs workers.address ("auto", "HOST:PORT",'
                ' "ray://HOST:PORT", or "local" to start one)'
            )
        if self.engine == "local" and (self.address is not None or self.abilities):
            raise ValueError(
                'workers.address and [workers.abilities] apply only with workers.engine = "ray"'
            )


# -- the whole file ----------------------------------------------------------------------


class McpConfig(Section, frozen=True):
    """``[mcp]``: outbound MCP connections (a connection's own values override these)."""

    # Seconds between probes of a connected server.
    heartbeat_interval: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 30.0
    # Seconds a probe may take before the connection counts as lost.
    probe_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 10.0
    # Seconds to connect to a server.
    connect_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    # Seconds to list a server's tools.
    list_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    # Seconds a remote tool call may take.
    call_timeout: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 60.0
    # Seconds before the first reconnect, doubled for each next one.
    backoff_base: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 1.0
    # The longest wait between reconnects, in seconds.
    backoff_cap: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 300.0
    # At daemon start, servers connect after start_delay..2*start_delay seconds (each its own),
    # so spawning stdio servers never competes with the daemon's own start.
    start_delay: Annotated[float, msgspec.Meta(ge=0, le=600)] = 1.0
    # A server's sampling/createMessage runs on this [models.NAME] (absent: sampling is refused).
    sampling_model: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "default"
    # Model tokens (prompt and answer) each server's sampling may spend a UTC day.
    sampling_tokens_per_day: Annotated[int, msgspec.Meta(ge=0, le=100_000_000)] = 20_000
    # The most a single sampling answer may be, whatever the server asks.
    sampling_max_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1024
    # Seconds the owner has to answer a server's form (elicitation): its durable request
    # then expires to a decline.
    elicitation_timeout: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 300.0
    # Seconds a task-augmented call (a tool whose execution.taskSupport is optional or
    # required) may run: its lifetime, beyond the call timeout.
    task_timeout: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 3600.0
    # The largest answer a server may send (bytes of one message): a bigger tool result is
    # refused as it arrives (mcp-result-too-large), never held; the session keeps serving.
    max_result_bytes: Annotated[int, msgspec.Meta(ge=65536, le=1 << 30)] = 8 * 1024 * 1024


# -- [accounts] and [weather] ----------------------------------------------------------

ZoneName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_+/-]{0,63}$")]


class AccountsConfig(Section, frozen=True):
    """``[accounts]``: how the calendar, contacts and email abilities reach people's servers."""

    timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 15.0  # seconds per request
    zone: ZoneName = "UTC"  # the zone times are shown in when a call names none
    max_message_mb: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 50  # largest mail read

    def __post_init__(self) -> None:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(self.zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"accounts.zone {self.zone!r} is not an IANA time zone") from None


class WeatherConfig(Section, frozen=True):
    """``[weather]``: Open-Meteo's two APIs (no key); a mirror or self-hosted one works alike."""

    forecast_url: HttpUrl = "https://api.open-meteo.com/v1/forecast"  # the forecast API
    geocoding_url: HttpUrl = "https://geocoding-api.open-meteo.com/v1/search"  # place names
    timeout: Annotated[float, msgspec.Meta(gt=0, le=120)] = 10.0  # seconds per request


# -- [telemetry] --------------------------------------------------------------------------


class TelemetryConfig(Section, frozen=True):
    """``[telemetry]``: OpenTelemetry traces and metrics over OTLP/HTTP (chalie.process.telemetry).

    Off unless ``otlp_endpoint`` is set; it needs the extra: pip install 'chalie[telemetry]'."""

    # The collector's OTLP/HTTP base URL (e.g. "http://127.0.0.1:4318"): traces go to
    # /v1/traces, metrics to /v1/metrics. Unset: nothing is traced or measured.
    otlp_endpoint: HttpUrl | None = None
    # Put what people and tools said in spans: messages, answers, tool arguments (secrets
    # stay redacted) and results. Off: spans carry names, ids, codes, timings and counts only.
    include_content: bool = False
    # The service.name resource attribute the spans and metrics carry.
    service_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "chalie"
    # Seconds between two exports of the metrics (and once more at stop).
    metrics_interval: Annotated[float, msgspec.Meta(ge=1.0, le=3600.0)] = 60.0


# -- [store] ------------------------------------------------------------------------------


class StoreConfig(Section, frozen=True):
    """``[store]``: where the durable state lives (chalie.store.store_place); unset: chalie.db."""

    # A PostgreSQL database several daemons share, "postgresql://user@host:5432/dbname",
    # never with a password in it (pip install 'chalie[postgres]').
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)] | None = None
    # The NAME of the environment variable holding the database password (unset: the
    # secrets file's "store.password", else libpq's PGPASSWORD or ~/.pgpass).
    password_env: EnvName | None = None
    # Seconds to reach the database.
    connect_timeout: Annotated[float, msgspec.Meta(ge=1.0, le=600.0)] = 10.0

    def __post_init__(self) -> None:
        if self.url is not None:
            check_url(self.url)


class Config(Section, frozen=True):
    """``config.toml``; ``home`` is not a key of it but the directory it was read from."""

    home: Path
    # Ability worker processes (isolation = "process"): a count, or a [workers] table.
    workers: Annotated[int, msgspec.Meta(ge=1, le=32)] | WorkersConfig = 2
    # The thread pool that runs inline abilities.
    inline_threads: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    # Seconds a permission request waits for a human before it counts as denied.
    approval_expiry: Annotated[float, msgspec.Meta(ge=1.0, le=86400.0)] = 300.0
    # The drop-in folder (default: CHALIE_ABILITIES_DIR, else <home>/abilities).
    abilities_dir: Path | None = None
    embedder: EmbedderConfig = EmbedderConfig()
    chat: ChatConfig = ChatConfig()
    brain: BrainConfig = BrainConfig()
    mcp_server: McpServerConfig = McpServerConfig()
    models: dict[str, ModelConfig] = {}
    channels: dict[str, ChannelConfig] = {}
    conversations: ConversationsConfig = ConversationsConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    mcp: McpConfig = McpConfig()
    outbox: OutboxConfig = OutboxConfig()
    web: WebConfig = WebConfig()
    accounts: AccountsConfig = AccountsConfig()
    weather: WeatherConfig = WeatherConfig()
    memory: MemoryConfig = MemoryConfig()
    background: BackgroundConfig = BackgroundConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    store: StoreConfig = StoreConfig()

    @classmethod
    def load(cls, home: str | os.PathLike[str] | None = None) -> Config:
        """Read ``<home>/config.toml`` (absent: every default); creates nothing on disk."""
        where = Home.locate(home)
        where.check()
        path = where.config_file
        raw: dict[str, Any] = {}
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read it: {_reason(exc)}") from None
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        return cls.from_mapping(raw, home=where.root, source=str(path))

    @classmethod
    def from_mapping(
        cls, raw: dict[str, Any], *, home: Path, source: str = CONFIG_SOURCE
    ) -> Config:
        """The configuration the mapping (a parsed ``config.toml``) describes, or ConfigError."""
        if "home" in raw:
            raise ConfigError(
                f"{source}: unknown key 'home' (choose the data directory with --home or {ENV_VAR})"
            )
        data = {**raw, "home": str(home)}
        if "abilities_dir" not in raw and os.environ.get(ABILITIES_ENV_VAR):
            data["abilities_dir"] = os.environ[ABILITIES_ENV_VAR]
        try:
            config = msgspec.convert(data, cls, strict=True, dec_hook=_decode_path)
        except msgspec.ValidationError as exc:
            message = _explain_named(source, raw, str(exc)) or _explain(source, raw, str(exc))
            raise ConfigError(message) from None
        if config.abilities_dir is None:
            return msgspec.structs.replace(config, abilities_dir=Home(home).abilities_dir)
        # A relative drop-in folder is relative to the data directory.
        return msgspec.structs.replace(config, abilities_dir=home / config.abilities_dir)

    @property
    def worker_settings(self) -> WorkersConfig:
        """``[workers]`` as a table, also when the file says only ``workers = N``."""
        workers = self.workers
        return workers if isinstance(workers, WorkersConfig) else WorkersConfig(count=workers)

    @property
    def store_place(self) -> Place:
        """Where the durable state lives: the SQLite file, or ``[store] url``'s database."""
        return place_for(self.store, self.layout.db, self.home)

    @property
    def layout(self) -> Home:
        """Every path in the data directory."""
        return Home(self.home)


def _decode_path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str) and value and "\x00" not in value:
        return Path(value).expanduser()
    raise TypeError("not a path")  # msgspec turns it into a ValidationError at the key


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


# -- one line for a bad key ---------------------------------------------------------------

_AT: Final = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>(?:\.[^`]*)?)`)?$", re.S)
_UNKNOWN: Final = re.compile(r"^Object contains unknown field `(?P<key>.*)`$", re.S)


def _explain(source: str, raw: dict[str, Any], message: str) -> str:
    found = _AT.match(message)
    assert found is not None  # the pattern matches any text
    msg, where = found["msg"], found["path"] or ""
    keys = [k for k in where.split(".") if k]
    unknown = _UNKNOWN.match(msg)
    if unknown:
        table = _struct_at(keys)
        known = ", ".join(f.name for f in table.fields if f.name != "home") if table else ""
        name = ".".join([*keys, unknown["key"]])
        return f"{source}: unknown key {name!r} (known keys here: {known})"
    if not keys:
        return f"{source}: {msg}"
    name = ".".join(keys)
    value = _lookup(raw, keys)
    info = _field_type(keys)
    if isinstance(value, dict) and info is not None:
        info = _table_of(info)
    if info is None or (isinstance(info, mi.StructType) and not isinstance(value, dict)):
        allowed = "a table" if info is not None else msg
        return f"{source}: {name} = {_show(value)}: must be {allowed}"
    if isinstance(info, mi.StructType):
        return f"{source}: [{name}]: {msg}"
    return f"{source}: {name} = {_show(value)}: must be {_allowed(info)}"


_NAMED: Final = re.compile(r" - at `\$\.(?P<section>\w+(?:\.\w+)*)\[\.\.\.\]")


def _explain_named(source: str, raw: dict[str, Any], message: str) -> str | None:
    """The one line for a bad key inside a named table (``[models.NAME]``, ``[channels.NAME]``,
    ``[workers.abilities.NAME]``).

    msgspec names such a place ``$.models[...]``; each table is checked again
    on its own to find which name holds the bad key.
    """
    found = _NAMED.search(message)
    if found is None:
        return None
    section = found["section"]
    info = _field_type(section.split("."))
    if not isinstance(info, mi.DictType):
        return None
    value_type = info.value_type
    if not isinstance(value_type, mi.StructType):
        return None
    tables = _lookup(raw, section.split("."))
    if not isinstance(tables, dict):
        return None
    for name, table in tables.items():
        try:
            msgspec.convert(table, value_type.cls, strict=True)
        except msgspec.ValidationError as exc:
            at = _AT.match(str(exc))
            assert at is not None
            msg, keys = at["msg"], [k for k in (at["path"] or "").split(".") if k]
            where = f"{section}.{name}"
            unknown = _UNKNOWN.match(msg)
            if unknown:
                known = ", ".join(f.name for f in value_type.fields)
                return (
                    f"{source}: unknown key '{where}.{unknown['key']}' (known keys here: {known})"
                )
            match = next((f for f in value_type.fields if keys and f.encode_name == keys[0]), None)
            if match is None:
                return f"{source}: [{where}]: {msg}"
            value = _lookup(table, keys)
            allowed = _allowed(_unwrap(match.type))
            return f"{source}: {where}.{keys[0]} = {_show(value)}: must be {allowed}"
    return None


def _struct_at(keys: list[str]) -> mi.StructType | None:
    info: mi.Type = mi.type_info(Config)
    for key in keys:
        if not isinstance(info, mi.StructType):
            return None
        match = next((f for f in info.fields if f.encode_name == key), None)
        if match is None:
            return None
        info = _table_of(_unwrap(match.type))
    return info if isinstance(info, mi.StructType) else None


def _field_type(keys: list[str]) -> mi.Type | None:
    parent = _struct_at(keys[:-1]) if len(keys) > 1 else mi.type_info(Config)
    if not isinstance(parent, mi.StructType):
        return None
    match = next((f for f in parent.fields if f.encode_name == keys[-1]), None)
    return None if match is None else _unwrap(match.type)


def _unwrap(info: mi.Type) -> mi.Type:
    if isinstance(info, mi.UnionType):
        rest = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(rest) == 1:
            return rest[0]
    return info


def _table_of(info: mi.Type) -> mi.Type:
    """A key that is a value or a table (``workers = 2`` or ``[workers]``), read as the table."""
    if isinstance(info, mi.UnionType):
        tables = [t for t in info.types if isinstance(t, mi.StructType)]
        if len(tables) == 1:
            return tables[0]
    return info


def _bound(value: float) -> str:
    """A range end as an operator writes it: 7776000, not 7.776e+06."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _allowed(info: mi.Type) -> str:
    if isinstance(info, mi.IntType | mi.FloatType):
        what = "an integer" if isinstance(info, mi.IntType) else "a number"
        low, high = info.ge, info.le
        if low is not None and high is not None:
            return f"{what} from {_bound(low)} to {_bound(high)}"
        return what
    if isinstance(info, mi.LiteralType):
        return "one of " + ", ".join(f'"{v}"' for v in info.values)
    if isinstance(info, mi.StrType):
        return "a string" + (f" matching {info.pattern}" if info.pattern else "")
    if isinstance(info, mi.BoolType):
        return "true or false"
    if isinstance(info, mi.CustomType) and info.cls is Path:
        return "a path (a non-empty string)"
    if isinstance(info, mi.DictType):
        if isinstance(info.value_type, mi.StructType):
            return "a table of named tables"
        values = _allowed(info.value_type).removeprefix("a ").removeprefix("an ")
        return f"a table of names to {values.replace('number', 'numbers', 1)}"
    if isinstance(info, mi.StructType):
        return "a table"
    if isinstance(info, mi.UnionType):
        return " or ".join(_allowed(t) for t in info.types if not isinstance(t, mi.NoneType))
    if isinstance(info, mi.VarTupleType | mi.ListType):
        return "a list of " + _allowed(info.item_type).removeprefix("a ").removeprefix("an ") + "s"
    return str(info)


def _lookup(raw: Any, keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(raw, dict) or key not in raw:
            return None
        raw = raw[key]
    return raw


def _show(value: Any) -> str:
    """The value as the operator wrote it in TOML, cut to one short line."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and not math.isfinite(value):
        text = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    elif isinstance(value, str):
        text = '"' + value.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    elif isinstance(value, dict):
        text = "a table"
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
