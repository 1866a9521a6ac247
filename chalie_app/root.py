"""The composition root: assembles the supervisor tree of one daemon and runs it.

It sits above the actors and the core (nothing in ``chalie/`` imports it but
the ``chalie run`` command); a feature joins the tree with one line in
:func:`child_specs`.

Start-up, in order (:func:`run`):

1. Take the single-instance lock: an ``flock`` on ``<home>/chalie.lock``. The
   kernel drops it when the process dies, so a stale pid file left by a
   SIGKILLed daemon never blocks the next start; a live daemon does.
2. Collect the registry (a duplicate name is a one-line start-up error) and
   mark trail rows a crash left ``running`` as interrupted.
3. Start the uvloop loop thread, then the supervisor tree. The children, in
   start order (:data:`TREE`, one function a child): policy, discovery,
   dispatcher (which hosts the worker pool on its thread), mcp, conversations,
   chat (when enabled), mcp_server, any extra children, control. The tree stops
   them in reverse order, so the control endpoint closes first and the workers
   are reaped when the dispatcher stops, after its last call.
4. Write the pid file, tell the terminal where things are and whether each
   model answers (:mod:`chalie.process.startup`, on a thread: the probes never delay
   the start), and wait for a stop: SIGINT or SIGTERM, ``chalie stop``, or an
   escalation from the root supervisor (restart intensity exceeded).
5. Stop the tree, then the loop thread; remove the pid file; drop the lock.

Exit codes are :mod:`chalie.process.daemon`'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pykka

import chalie
from actors.child_ref import ChildRef
from actors.directory import Directory
from actors.loop import EventLoopThread
from actors.process.control import ControlActor
from actors.process.supervisor import Supervisor
from chalie.brain.access import DashboardSessions
from chalie.calls.registry import DuplicateAbilityError, Registry
from chalie.conversation.catalogue import ToolCatalogue
from chalie.net.admission import raise_descriptor_limit
from chalie.process import control, telemetry
from chalie.process.config import Config
from chalie.process.daemon import (
    EXIT_ALREADY_RUNNING,
    EXIT_ESCALATED,
    EXIT_OK,
    EXIT_STARTUP_FAILED,
    AlreadyRunning,
    StartupError,
    instance_lock,
    remove_pid_file,
    write_pid_file,
)
from chalie.process.home import Home, HomeError
from chalie.process.supervision import ChildSpec, OnDemand
from chalie.services import Services
from chalie.store.store_place import Place, StoreUnavailable, check_ported
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, ToolOutcome

if TYPE_CHECKING:
    from actors.discovery import WriterFactory
    from chalie.web.kit import WebKit

log = logging.getLogger("chalie.process.daemon")

A = TypeVar("A", bound=pykka.Actor)


# -- the running daemon ---------------------------------------------------------------


@dataclass
class Runtime:
    """What the tree's children share: built once at start-up, read by every child."""

    config: Config
    registry: Registry
    events: EventBus
    loop: EventLoopThread
    services: Services
    db_path: Place
    started: float = field(default_factory=time.time)
    stop_requested: threading.Event = field(default_factory=threading.Event)
    escalation: tuple[str, str] | None = None
    supervisor: pykka.ActorRef[Any] | None = None
    # The tree's child directory: restart-proof typed handles, made without asking anyone.
    directory: Directory = field(default_factory=Directory)
    # The Brain's dashboard sessions: kept here, so a restart of the web server keeps them.
    sessions: DashboardSessions = field(default_factory=DashboardSessions)
    # The scheduler's clock (None: the wall clock).
    clock: Any = None

    def child(self, child_id: str, kind: type[A]) -> ChildRef[A]:
        """A typed, restart-proof handle on one child of the tree (an actor of class ``kind``)."""
        return self.directory.ref(child_id, kind)

    def dispatch(self, call: ToolCall) -> Future[ToolOutcome]:
        """Hand one call to the dispatcher; the future never raises (the seam DirectCalls uses)."""
        from actors.calls.dispatcher import DispatcherActor, submit

        return submit(self.child("dispatcher", DispatcherActor).current(), call)

    @functools.cached_property
    def catalogue(self) -> ToolCatalogue:
        """The one tool catalogue (the registry and the turns' injections) the turns and
        the MCP server's gateway read."""
        return ToolCatalogue(self.registry, self.services.turns)

    def input_schema(self, tool: str) -> dict[str, Any] | None:
        """A registered tool's input schema as a call may use it (``async`` allowed)."""
        entry = self.registry.get(tool)
        return None if entry is None else entry.cls.input_schema(allow_async=True)

    def request_stop(self) -> None:
        self.stop_requested.set()

    def on_escalate(self, child_id: str, last_error: str) -> None:
        self.escalation = (child_id, last_error)
        self.stop_requested.set()

    def status(self) -> dict[str, Any]:
        tree: dict[str, Any] = {"children": [], "uptime": 0.0}
        if self.supervisor is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                tree = self.supervisor.proxy().status().get(timeout=5)
        workers: Any = None
        with contextlib.suppress(Exception):
            from actors.calls.dispatcher import DispatcherActor

            workers = (
                self.child("dispatcher", DispatcherActor)
                .within(5)
                .call(DispatcherActor.workers_status)
            )
        chat: Any = None
        with contextlib.suppress(Exception):
            from actors.conversation.chat_bridge import ChatBridge

            chat = self.child("chat", ChatBridge).within(5).call(ChatBridge.addresses)
        mcp_server: Any = None
        with contextlib.suppress(Exception):
            from actors.mcp.server import McpServerActor

            mcp_server = (
                self.child("mcp_server", McpServerActor).within(5).call(McpServerActor.status)
            )
        discovery = self.services.discovery
        scheduler: Any = None
        with contextlib.suppress(Exception):
            from actors.scheduler import Scheduler

            scheduler = self.child("scheduler", Scheduler).within(5).call(Scheduler.status)
        memory = self.services.memory
        return {
            "pid": os.getpid(),
            "version": chalie.__version__,
            "home": str(self.config.home),
            "uptime": time.time() - self.started,
            "actors": tree["children"],
            "workers": workers,
            "chat": chat,
            "mcp_server": mcp_server,
            "loop": self.loop.is_alive(),
            "discovery": None if discovery is None else discovery.snapshot(),
            "memory": None if memory is None else memory.book.status(),
            "scheduler": scheduler,
        }


ExtraChild = Callable[[Runtime], ChildSpec]


@dataclass
class Parts:
    """What several children of the tree are built with: made once, before any starts.

    Each start runs on the supervisor's thread, so it must not ask the supervisor
    anything: children find each other later, through ChildRefs.
    """

    workers: Any  # actors.workers.worker_pool.WorkerPoolHandle (its pool hosted by the dispatcher)
    embedder: Any  # chalie.discovery.lazy_embedder.LazyEmbedder
    discovery: Any  # actors.discovery.DiscoveryHandle
    mcp: Any  # chalie_app.mcp_wiring.McpWiring
    # Control commands the children bring (memory, reminders), served by the control child.
    routes: list[Any] = field(default_factory=list)

    @classmethod
    def build(cls, rt: Runtime) -> Parts:
        from actors.discovery import DiscoveryActor, DiscoveryHandle
        from actors.workers.worker_pool import WorkerPoolHandle
        from chalie.discovery.lazy_embedder import LazyEmbedder
        from chalie_app.mcp_wiring import McpWiring

        cfg = rt.config
        rt.sessions = DashboardSessions(ttl=cfg.brain.session_ttl, link_ttl=cfg.brain.link_ttl)
        from chalie.discovery.state import IndexState

        # The state the actor writes and the handle reads (a find during the first build
        # is answered at once: discovery-index-building).
        discovery = DiscoveryHandle(rt.child("discovery", DiscoveryActor), state=IndexState())
        rt.services.discovery = discovery
        rt.services.personal = personal_runtime(rt)
        return cls(
            workers=WorkerPoolHandle(),
            # The local embedding model loads on the first find, not at start (idle memory).
            embedder=LazyEmbedder.for_config(
                cfg.embedder.options(), idle_unload=cfg.embedder.idle_unload
            ),
            discovery=discovery,
            mcp=McpWiring(rt),  # registers cached MCP proxies before discovery starts
        )


# -- the tree: one function a child, each giving its ChildSpec (None: not configured) ----


def _policy(rt: Runtime, parts: Parts) -> ChildSpec:
    from concurrent.futures import Future

    from actors.calls.dispatcher import DispatcherActor
    from actors.gate.policy import PolicyActor
    from chalie.wire.actor_messages import Dispatch

    expiry = rt.config.approval_expiry

    def resume(call: ToolCall) -> None:
        """A stored call answered after a restart goes back to the dispatcher (a tell; it
        runs in the background and its result reaches the conversation)."""
        rt.child("dispatcher", DispatcherActor).tell(Dispatch(call, Future()))

    return ChildSpec(
        "policy",
        lambda: PolicyActor.start(rt.db_path, rt.events, approval_expiry=expiry, resume=resume),
    )


def _discovery(rt: Runtime, parts: Parts) -> ChildSpec:
    from actors.discovery import DiscoveryActor

    cfg = rt.config
    return ChildSpec(
        "discovery",
        lambda: DiscoveryActor.start(
            registry=rt.registry,
            home=cfg.home,
            embedder=parts.embedder,
            embedder_config=cfg.embedder.options(),
            state=parts.discovery.state,
            db_path=rt.db_path,
            learning=cfg.discovery,
            writer=example_writer(rt),
        ),
        shutdown=10.0,
    )


def _dispatcher(rt: Runtime, parts: Parts) -> ChildSpec:
    from actors.calls.dispatcher import DispatcherActor
    from actors.gate.policy import PolicyActor
    from actors.workers.worker_pool import HostedPool

    cfg = rt.config
    workers = cfg.worker_settings
    # The local engine's pool runs on the dispatcher's thread: a worker call crosses no
    # broker thread. Another engine runs the process abilities itself (WORKER_ENGINES).
    local = workers.engine == "local"
    return ChildSpec(
        "dispatcher",
        lambda: DispatcherActor.start(
            rt.registry,
            rt.services,
            rt.db_path,
            rt.child("policy", PolicyActor),
            parts.workers,
            rt.events,
            inline_threads=cfg.inline_threads,
            children=rt.directory,
            outbox_max_age=cfg.outbox.max_age,
            outbox_max_rows=cfg.outbox.max_rows,
            parts={"mcp": parts.mcp.handle},
            pool=HostedPool(cfg.home, workers=workers.count, handle=parts.workers)
            if local
            else None,
            worker_settings=workers,
            dropins=cfg.abilities_dir,
        ),
        shutdown=10.0,  # its stop reaps the workers
    )


def _mcp(rt: Runtime, parts: Parts) -> ChildSpec:
    spec: ChildSpec = parts.mcp.spec
    return spec


def _memory(rt: Runtime, parts: Parts) -> ChildSpec:
    from chalie_app import memory_part

    spec, routes = memory_part.memory_parts(rt, parts.embedder)
    parts.routes.extend(routes)
    return spec


def _scheduler(rt: Runtime, parts: Parts) -> ChildSpec:
    from chalie_app import scheduler_part

    spec, routes = scheduler_part.scheduler_parts(rt, rt.clock)
    parts.routes.extend(routes)
    return spec


def _conversations(rt: Runtime, parts: Parts) -> ChildSpec:
    from actors.conversation.conversations import Conversations

    return ChildSpec("conversations", lambda: Conversations.start(rt, TURNS), shutdown=15.0)


def _chat(rt: Runtime, parts: Parts) -> ChildSpec | None:
    from actors.conversation.chat_bridge import ChatBridge
    from actors.conversation.conversations import Conversations
    from chalie_app.brain_backend import brain_factory

    cfg = rt.config
    if not cfg.chat.enabled:
        return None
    conversations = rt.child("conversations", Conversations)
    brain = brain_factory(rt, rt.sessions, rt.events, cfg.chat) if cfg.brain.enabled else None
    return ChildSpec(
        "chat",
        lambda: ChatBridge.start(
            cfg.chat, cfg.home, rt.db_path, rt.loop, rt.events, conversations, brain
        ),
        shutdown=10.0,
    )


def _mcp_server(rt: Runtime, parts: Parts) -> ChildSpec:
    from actors.calls.dispatcher import DispatcherActor, DispatcherClient
    from actors.conversation.conversations import Conversations
    from actors.mcp import server as mcp_server

    return ChildSpec(
        "mcp_server",
        # Read at each start: the dashboard may change it and restart this child.
        lambda: mcp_server.start_for(
            rt.config.mcp_server,
            rt.loop,
            rt.db_path,
            rt.child("conversations", Conversations),
            rt.events,
            mcp_server.DispatcherTools(
                DispatcherClient(rt.child("dispatcher", DispatcherActor)), rt.catalogue
            ),
        ),
        shutdown=10.0,
    )


def _control(rt: Runtime, parts: Parts) -> ChildSpec:
    from actors.conversation.commands import ConversationCommands
    from chalie_app.brain_backend import brain_routes

    cfg = rt.config
    return ChildSpec(
        "control",
        lambda: ControlActor.start(
            rt,
            home=cfg.home,
            loop=rt.loop,
            events=rt.events,
            dispatch=rt.dispatch,
            end_turn=rt.services.turns.forget,
            routes=[
                *ConversationCommands(rt).routes(),
                *brain_routes(rt, rt.sessions),
                *parts.routes,
            ],
        ),
    )


Child = Callable[[Runtime, Parts], ChildSpec | None]

# The conversations child supervises one TurnActor a live conversation, started on
# demand from this template (OTP's simple_one_for_one): transient, so an idle stop is
# final and a failure restarts it (its turn ended with an error first); past 5
# restarts in 30 s the conversations supervisor gives up and this tree restarts it.
TURNS: Final = OnDemand("turn", restart="transient", shutdown=5.0, intensity=5, period=30.0)

# The tree's children in start order; the supervisor stops them in reverse, so the
# control endpoint closes first and the dispatcher, which reaps the workers it hosts,
# stops after everything that sends it calls. Any extra children (tests) start just
# before control.
TREE: Final[tuple[Child, ...]] = (
    _policy,
    _discovery,
    _dispatcher,
    _mcp,
    _memory,
    _conversations,
    _scheduler,
    _chat,
    _mcp_server,
)
LAST: Final[tuple[Child, ...]] = (_control,)


def child_specs(rt: Runtime, extra: Sequence[ExtraChild] = ()) -> list[ChildSpec]:
    """The tree's children in start order (:data:`TREE`, any extra ones, then control)."""
    parts = Parts.build(rt)
    specs = [spec for make in TREE if (spec := make(rt, parts)) is not None]
    specs.extend(make(rt) for make in extra)
    specs.extend(spec for make in LAST if (spec := make(rt, parts)) is not None)
    return specs


def personal_runtime(rt: Runtime) -> Any:
    """The accounts, settings and caches of the calendar, contacts, email and weather abilities."""
    from chalie.personal.runtime import PersonalRuntime, settings_from

    return PersonalRuntime.open(rt.db_path, rt.config.home, settings_from(rt.config))


def example_writer(rt: Runtime) -> WriterFactory | None:
    """What writes examples for tools that arrive without any: [models.default], if configured."""
    from actors.example_writer import Deliver, ExampleWriter
    from chalie.discovery.written import WrittenCache
    from chalie.providers.client import ModelClient

    cfg = rt.config
    model = cfg.models.get("default")
    if model is None or not cfg.discovery.write_examples:
        return None

    def schema_of(name: str) -> dict[str, Any] | None:
        entry = rt.registry.get(name)
        return None if entry is None else entry.cls.input_schema()

    def make(deliver: Deliver) -> ExampleWriter:
        return ExampleWriter(
            rt.loop,
            ModelClient("default", model),
            WrittenCache(rt.db_path),
            deliver,
            per_minute=cfg.discovery.write_budget_per_minute,
            schema_of=schema_of,
        )

    return make


def _install_signals(stop: threading.Event) -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals reach only the main thread; in-process tests stop otherwise

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signals = [signal.SIGINT, signal.SIGTERM]
    # A closed terminal (SIGHUP) stops cleanly too, unless nohup asked to ignore it.
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    old = {s: signal.signal(s, handler) for s in signals}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore


def prepare(config: Config) -> tuple[Registry, Place]:
    """Start-up work before any thread runs: the registry and the trail's crash recovery."""
    from chalie.calls.trail import Trail

    try:
        registry = Registry.collect(dropin=config.abilities_dir)
    except DuplicateAbilityError as exc:
        raise StartupError(str(exc)) from None
    for failure in registry.failures:
        log.warning(
            "ability module not loaded", extra={"path": failure.path, "error": failure.error}
        )
    from chalie.conversation.channels import channel_problems, resolve_channels

    try:
        channels = resolve_channels(config.channels)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    problems = channel_problems(channels, registry.names(), config.models)
    if problems:
        raise StartupError(problems[0])
    try:
        control.endpoint(config.home)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    try:
        db_path = config.store_place
        check_ported(db_path)
    except StoreUnavailable as exc:
        raise StartupError(str(exc)) from None
    book = Trail(db_path)
    try:
        marked = book.recover_calls()
    finally:
        book.close()
    if marked:
        log.warning(
            "calls in flight at the last stop marked interrupted", extra={"count": len(marked)}
        )
    deliver_interrupted(config, db_path, [m for m in marked if m[3]])
    return registry, db_path


def deliver_interrupted(
    config: Config, db_path: Place, background: Sequence[tuple[str, str, str, bool]]
) -> None:
    """A background call the last run lost: its conversation gets an interrupted result.

    Its turn was told the result would come (and not to call it again); without this
    nothing ever came. The result waits in the outbox, and the Conversations actor hands
    it to its conversation as it starts, like any background result.
    """
    if not background:
        return
    from chalie.calls.outbox import Outbox
    from chalie.conversation.store import interrupted_envelope
    from chalie.wire.events import BackgroundResult

    outbox = Outbox(db_path, max_age=config.outbox.max_age, max_rows=config.outbox.max_rows)
    try:
        for call_id, conversation_id, tool, _ in background:
            outbox.put(
                BackgroundResult(
                    call_id=call_id,
                    conversation_id=conversation_id,
                    tool=tool,
                    envelope=interrupted_envelope(tool),
                    status="error",
                    code="interrupted",
                )
            )
    finally:
        outbox.close()
    log.warning(
        "background calls lost at the last stop: their conversations get an interrupted result",
        extra={"count": len(background)},
    )


def run(
    config: Config,
    *,
    extra_children: Sequence[ExtraChild] = (),
    ready: Callable[[Runtime], None] | None = None,
    clock: Any = None,
) -> int:
    """Run the daemon in the foreground until it is stopped; returns the exit code.

    ``clock``: the scheduler's (None: the wall clock); tests pass one they move by hand.
    """
    home = config.home
    # Room for every listener's share and a reserve (chalie.net.admission): a flood of
    # connections must never leave ZeroMQ without a descriptor (libzmq aborts then).
    raise_descriptor_limit()
    try:
        config.layout.create()
        _secure_home(config.layout)
        with instance_lock(home):
            return _run_locked(config, extra_children, ready, clock)
    except AlreadyRunning as exc:
        log.error("%s", exc)
        return EXIT_ALREADY_RUNNING
    except (StartupError, HomeError) as exc:
        log.error("start-up failed: %s", exc)
        return EXIT_STARTUP_FAILED


def _secure_home(layout: Home) -> None:
    """Secret files made 0600 at every start, each loose one reported; a home other users
    can read or enter is warned about (chalie.process.home.Home.secure)."""
    fixed, home_mode = layout.secure()
    for path, mode in fixed:
        log.warning(
            "a private file other users could read was made 0600",
            extra={"path": str(path), "mode": f"{mode:04o}"},
        )
    if home_mode is not None:
        log.warning(
            "other users can read or enter the data directory %s (mode %04o); "
            "`chmod 700 %s` keeps them out",
            layout.root,
            home_mode,
            layout.root,
        )


def _run_locked(
    config: Config,
    extra_children: Sequence[ExtraChild],
    ready: Callable[[Runtime], None] | None,
    clock: Any = None,
) -> int:
    registry, db_path = prepare(config)
    try:
        telemetry.start(config.telemetry)  # nothing happens, nor is imported, when unset
    except ImportError as exc:
        raise StartupError(str(exc)) from None
    events = EventBus()
    services = Services()
    loop = EventLoopThread()
    rt = Runtime(config, registry, events, loop, services, db_path, clock=clock)
    web = _web_services(rt)
    restore_signals = _install_signals(rt.stop_requested)
    try:
        loop.start()
        rt.supervisor = Supervisor.start(
            child_specs(rt, extra_children), on_escalate=rt.on_escalate, directory=rt.directory
        )
        write_pid_file(config.home)
        log.info(
            "daemon started",
            extra={"pid": os.getpid(), "home": str(config.home), "abilities": len(registry)},
        )
        threading.Thread(target=announce, args=(rt,), name="announce", daemon=True).start()
        if ready is not None:
            ready(rt)
        while not rt.stop_requested.wait(0.2):
            pass
    finally:
        _shutdown(rt)
        web.close()
        telemetry.stop()  # the last spans and metrics are sent
        restore_signals()
    if rt.escalation is not None:
        child_id, error = rt.escalation
        log.error(
            "daemon stopped: child %s exceeded its restart intensity; last error: %s",
            child_id,
            error,
            extra={"child": child_id, "last_error": error},
        )
        return EXIT_ESCALATED
    log.info("daemon stopped")
    return EXIT_OK


def announce(rt: Runtime) -> None:
    """Print the start-up lines (:mod:`chalie.process.startup`) on standard output, once."""
    import sys

    from actors.conversation.chat_bridge import ChatBridge
    from actors.mcp.server import McpServerActor
    from chalie.process.config import ModelConfig
    from chalie.process.startup import Where, brain_url, startup_lines
    from chalie.providers.probe import probe_all

    cfg = rt.config
    deadline = time.monotonic() + 120
    while not _tree_up(rt):  # the addresses are known once every child runs
        if rt.stop_requested.wait(0.1) or time.monotonic() > deadline:
            return
    websocket = mcp = None
    with contextlib.suppress(Exception):
        websocket = rt.child("chat", ChatBridge).within(5).call(ChatBridge.addresses)["websocket"]
    with contextlib.suppress(Exception):
        mcp = rt.child("mcp_server", McpServerActor).within(5).call(McpServerActor.status)["url"]
    models = dict(cfg.models) or {"default": ModelConfig()}
    try:
        probes = rt.loop.submit(probe_all(models)).result(10)
    except Exception as exc:  # the loop stopped: the daemon is stopping already
        log.info("start-up probes not run: %s", exc)
        return
    where = Where(
        pid=os.getpid(),
        home=cfg.home,
        config_file=cfg.layout.config_file,
        brain=brain_url(websocket) if cfg.brain.enabled else None,
        brain_off=(
            "[brain] enabled = false"
            if not cfg.brain.enabled
            else "[chat] enabled = false"
            if not cfg.chat.enabled
            else "[chat] websocket = false"
            if not cfg.chat.websocket
            else f"the chat web server cannot listen on {cfg.chat.host}:{cfg.chat.port}; "
            "set [chat] port in config.toml (the log says why)"
        ),
        mcp=mcp,
        models_configured=bool(cfg.models),
    )
    with contextlib.suppress(OSError, ValueError):  # no terminal, or a closed one
        sys.stdout.write("\n".join(startup_lines(where, probes)) + "\n")
        sys.stdout.flush()
    for probe in probes:
        log.info(
            "model probe",
            extra={"model": probe.name, "verdict": probe.verdict, "detail": probe.detail},
        )


def _tree_up(rt: Runtime) -> bool:
    sup = rt.supervisor
    if sup is None:
        return False
    try:
        children = sup.proxy().status().get(timeout=5)["children"]
    except (pykka.ActorDeadError, pykka.Timeout):
        return False
    return all(child["alive"] for child in children)


def _web_services(rt: Runtime) -> WebKit:
    """The web tools' shared parts and the delegate port, for abilities (services)."""
    from actors.conversation.delegates import DelegateRunner
    from chalie.web.kit import WebKit

    web = WebKit(rt.config.web, home=rt.config.home)
    rt.services.web = web
    rt.services.delegates = DelegateRunner(
        rt, on_end=lambda _channel, turn_id: web.end_session(turn_id)
    )
    return web


def _shutdown(rt: Runtime) -> None:
    """Stop the tree, each wait bounded. An actor stuck where it cannot hear its stop (a
    start-up step spinning in native code) is left behind, named in the log: the stop goes
    on, and chalie.process.daemon.exit_process leaves without its thread."""
    sup, rt.supervisor = rt.supervisor, None
    if sup is not None:
        try:
            # Children first, in reverse start order, each within its shutdown time.
            sup.stop(block=True, timeout=60)
        except pykka.ActorDeadError:
            pass
        except pykka.Timeout:
            log.error("the supervision tree did not stop within 60 s; leaving it behind")
    # Anything started outside the tree would keep the process alive on its
    # non-daemon thread; nothing should be left, and nothing may hang the exit.
    leftovers = pykka.ActorRegistry.get_all()
    if leftovers:
        names = sorted({r.actor_class.__name__ for r in leftovers})
        log.warning(
            "actors still running after the tree stopped",
            extra={"count": len(leftovers), "actors": names},
        )
        try:
            pykka.ActorRegistry.stop_all(block=True, timeout=10)
        except pykka.Timeout:
            log.error(
                "actors did not stop within 10 s (stuck in a step that cannot be stopped); "
                "leaving without them",
                extra={"actors": names},
            )
    rt.loop.stop()
    remove_pid_file(rt.config.home)
