"""McpConnectionActor: one remote MCP server's connection, supervised by McpConnections.

Lifecycle of the actor:

1. ``on_start`` loads the server's cached tool rows and starts connecting:
   a :class:`chalie.mcp.session.McpSession` opens on the daemon's event loop; the
   actor does not wait (the daemon is ready before any server answers, and
   servers come online in parallel).
2. Connected: status ``online`` (stored with the time and the protocol
   version), an immediate re-sync, and the heartbeat: every interval (with
   ±10 % jitter) a probe under a timeout. A failed probe, a lost session or a
   failed connect sets ``offline`` with the reason and schedules a reconnect
   after a capped exponential backoff with jitter; every reconnect re-syncs,
   and so does every heartbeat cycle (the listing is digested: an unchanged
   one is not re-planned, so a quiet server costs one round trip a cycle).
3. ``tools/list_changed`` triggers a re-sync at once (coalesced while one
   runs, and at most one every :data:`MIN_RESYNC_GAP`: a server that announces
   a change at every listing is listed a few times a second, not in a loop).
   A re-sync lists every page, diffs against the store
   (:func:`chalie.mcp.tools.plan`), writes the rows, replaces the changed
   proxy classes in the registry, and hands the discovery index its
   additions and removals and the policy its quarantined tools (back to
   ``ask``) on a side thread, so nothing waits on an embedder.
4. A :class:`RemoteCall` runs on the loop as its own task; the result is
   mapped (:mod:`chalie.mcp.results`) and handed to the caller's ``done``
   from the loop thread. :class:`CancelRemoteCall` cancels the task (the SDK
   sends ``notifications/cancelled``).
5. ``on_stop`` ends the calls in flight and closes the session.

Every piece of state is touched on the actor's thread: callbacks from the
loop come back as messages, stamped with the link generation so a late one
from an old session is ignored. Timers are ``loop.call_later`` (no thread).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Final, TextIO, cast

from actors.actor import SupervisedActor, tell_quietly
from actors.mcp.deps import McpDeps, announce, back_to_ask, serve_skills
from chalie.mcp.connection_view import ConnectionView
from chalie.mcp.extras import install_extras, prompt_skill
from chalie.mcp.oauth import daemon_auth
from chalie.mcp.proxy import install
from chalie.mcp.secrets import MissingSecret, SecretFile, resolve
from chalie.mcp.server_log import ServerLog, log_path
from chalie.mcp.session import ConnectFailure, McpSession, SessionInfo, describe, task_support
from chalie.mcp.spec import ServerSpec
from chalie.mcp.store import McpStore, Status, daemon_id
from chalie.mcp.tools import ToolRow, plan
from chalie.wire.actor_messages import ProbeConnection, RefreshServer

log = logging.getLogger("chalie.mcp")

CHILD_PREFIX: Final = "mcp:"
JITTER: Final = 0.1
# Re-syncs of one server begin at most this often (a list_changed loop is throttled).
MIN_RESYNC_GAP: Final = 0.5
STOP_GRACE: Final = 3.0


def child_id(server: str) -> str:
    return f"{CHILD_PREFIX}{server}"


# -- private messages: the event loop and timers reporting to the actor ----------------


@dataclass(frozen=True)
class _Connected:
    gen: int
    future: concurrent.futures.Future[SessionInfo]


@dataclass(frozen=True)
class _Beat:
    gen: int


@dataclass(frozen=True)
class _Probed:
    gen: int
    future: concurrent.futures.Future[float]


@dataclass(frozen=True)
class _Lost:
    gen: int
    reason: str


@dataclass(frozen=True)
class _Changed:
    gen: int


@dataclass(frozen=True)
class _ResyncDue:
    """A re-sync deferred by the rate limit is due."""

    gen: int


@dataclass(frozen=True)
class _Listed:
    gen: int
    future: concurrent.futures.Future[list[Any]]


@dataclass(frozen=True)
class _ExtrasListed:
    gen: int
    future: concurrent.futures.Future[tuple[dict[str, bool], list[Any], str]]


@dataclass(frozen=True)
class _Reconnect:
    gen: int


@dataclass(frozen=True)
class _FirstConnect:
    pass


# -- the actor ---------------------------------------------------------------------------


def listing_digest(listed: list[Any]) -> str:
    """A digest of a tools/list answer: equal digests, nothing to re-plan."""
    h = hashlib.blake2b(digest_size=16)
    for tool in listed:
        dump = getattr(tool, "model_dump_json", None)
        h.update((dump(by_alias=True) if callable(dump) else repr(tool)).encode())
        h.update(b"\x00")
    return h.hexdigest()


class McpConnectionActor(SupervisedActor):
    """Owns one server's session, heartbeat, re-sync and calls (see the module doc)."""

    def __init__(self, spec: ServerSpec, deps: McpDeps, *, delay: float = 0.0) -> None:
        super().__init__()
        self._delay = delay
        self._spec = spec
        self._deps = deps
        self._cfg = deps.config
        self._store: McpStore | None = None
        self._secrets = SecretFile(deps.home)
        self._rows: dict[str, ToolRow] = {}
        self._link: McpSession | None = None
        self._gen = 0
        self._status: Status = "connecting"
        self._reason = ""
        self._auth_status: int | None = None
        self._attempt = 0
        self._syncing = False
        self._dirty = False
        self._listed_at = -MIN_RESYNC_GAP  # monotonic: when the last re-sync began
        self._resync_due = False  # a deferred re-sync is scheduled
        self._digest = ""  # of the last listing applied: an unchanged one is not re-planned
        self._extras_digest = ""  # of the last resources/prompts offer applied
        self._errlog: ServerLog | None = None
        self._stopping = False
        self.last_sync: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self._spec.name

    # -- lifecycle ---------------------------------------------------------------------
    def on_start(self) -> None:
        self._store = McpStore(self._deps.db_path, daemon=daemon_id(self._deps.home))
        self._load_rows()
        if self._deps.errlog_dir is not None:
            # Bounded and rotated: a server's stderr cannot fill the disk (chalie.mcp.server_log).
            self._errlog = ServerLog(log_path(self._deps.errlog_dir, self.name))
        if self._delay > 0:
            self._set_status("connecting", "waiting for the daemon's start to settle")
            self._later(self._delay, _FirstConnect())
        else:
            self._connect()

    def on_stop(self) -> None:
        self._stopping = True
        self._close_all("the connection to the server was stopped")

    def on_failure(self, *exc: Any) -> None:
        self._stopping = True
        self._close_all("the connection actor failed")

    def _close_all(self, reason: str) -> None:
        self._deps.routes.pop(self.name, None)
        link, self._link = self._link, None
        if link is not None:
            with contextlib.suppress(Exception):
                self._deps.loop.submit(link.close(grace=STOP_GRACE - 0.5)).result(STOP_GRACE)
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set_status(self.name, "offline", reason=reason, since=time.time())
            self._store.close()
            self._store = None
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    def _load_rows(self) -> None:
        assert self._store is not None
        self._rows = {r.proxy: r for r in self._store.tools(self.name)}

    # -- plumbing ----------------------------------------------------------------------
    def _tell(self, message: Any) -> None:
        tell_quietly(self.actor_ref, message)

    def _later(self, delay: float, message: Any) -> None:
        """Deliver ``message`` to this actor after ``delay`` seconds (a loop timer, no thread)."""
        try:
            loop = self._deps.loop.loop
            loop.call_soon_threadsafe(loop.call_later, delay, self._tell, message)
        except Exception:
            log.warning("%s: the event loop is not running; no timer set", self.name)

    def _set_status(self, status: Status, reason: str = "", **extra: Any) -> None:
        changed = status != self._status
        self._status, self._reason = status, reason
        self._publish()
        if self._store is None:
            return
        try:
            self._store.set_status(
                self.name, status, reason=reason, since=time.time() if changed else None, **extra
            )
        except Exception:
            log.exception("mcp server %s: recording its status failed", self.name)
        if changed:
            log.info("mcp server %s is %s%s", self.name, status, f" ({reason})" if reason else "")

    # -- connecting ----------------------------------------------------------------------
    def _connect(self) -> None:
        self._gen += 1
        gen = self._gen
        self._auth_status = None
        try:
            resolved = resolve(self._spec, self._secrets)
        except MissingSecret as exc:
            self._offline(str(exc), error=str(exc))
            return
        auth: Any = None
        hidden: tuple[str, ...] = ()
        held: list[McpSession] = []
        if resolved.oauth:
            # the grant from chalie mcp login; when it needs the owner, the link says so
            auth, storage = daemon_auth(resolved, self._secrets, lambda: held[0].login_required())
            if storage.tokens() is None:  # never logged in: nothing to try (nor to register)
                self._needs_login()
                return
            hidden = tuple(storage.secrets())
        link = McpSession(
            resolved,
            on_change=lambda: self._tell(_Changed(gen)),
            on_lost=lambda reason: self._tell(_Lost(gen, reason)),
            errlog=cast("TextIO", self._errlog),
            read_timeout=self._deps.timeout(self._spec),
            asks=self._deps.asks,
            auth=auth,
            hidden=hidden,
            max_message=self._cfg.max_result_bytes,
        )
        held.append(link)
        link.task_lifetime = self._cfg.task_timeout
        self._link = link
        self._set_status("connecting", "connecting")
        timeout = self._spec.connect_timeout or self._cfg.connect_timeout
        try:
            fut = self._deps.loop.submit(link.open(timeout))
        except Exception as exc:
            self._offline(f"the event loop is not running ({type(exc).__name__})")
            return
        fut.add_done_callback(lambda f: self._tell(_Connected(gen, f)))

    def _offline(self, reason: str, *, error: str | None = None) -> None:
        """Mark offline (or needing login: an OAuth grant the owner must renew), drop the
        session, and schedule a reconnect with backoff and jitter."""
        link, self._link = self._link, None
        status: Status = "offline"
        if link is not None:
            if link.needs_login:
                status, self._auth_status = "needs-login", 401
                reason = f"needs login: run chalie mcp login {self.name}"
            with contextlib.suppress(Exception):
                self._deps.loop.submit(link.close(grace=2.0))
        self._set_status(status, reason, error=error if error is not None else reason)
        if self._stopping:
            return
        delay = min(self._cfg.backoff_cap, self._cfg.backoff_base * 2 ** min(self._attempt, 30))
        delay = random.uniform(delay / 2, delay)
        self._attempt += 1
        self._later(delay, _Reconnect(self._gen))

    def _needs_login(self) -> None:
        self._link, self._auth_status = None, 401
        why = f"needs login: run chalie mcp login {self.name}"
        self._set_status("needs-login", why, error=why)
        if not self._stopping:
            self._later(self._cfg.backoff_cap, _Reconnect(self._gen))

    def _on_connected(self, msg: _Connected) -> None:
        if msg.gen != self._gen:
            return
        error = msg.future.exception()
        if error is not None:
            if isinstance(error, ConnectFailure):
                self._auth_status = error.status if error.kind == "auth" else None
                self._offline(error.message)
            else:
                self._offline(self._why(error))
            return
        info = msg.future.result()
        self._attempt = 0
        self._set_status("online", "", protocol=info.protocol, heartbeat=time.time())
        self._resync()
        self._schedule_beat()

    def _why(self, error: BaseException) -> str:
        """One line about an error, with every resolved secret of this server scrubbed."""
        text = describe(error)
        return self._link.scrub(text) if self._link is not None else text[:500]

    # -- heartbeat -----------------------------------------------------------------------
    def _interval(self) -> float:
        base = self._spec.heartbeat or self._cfg.heartbeat_interval
        return base * random.uniform(1 - JITTER, 1 + JITTER)

    def _schedule_beat(self) -> None:
        self._later(self._interval(), _Beat(self._gen))

    def _on_beat(self, msg: _Beat) -> None:
        if msg.gen != self._gen or self._status != "online" or self._link is None:
            return
        gen = msg.gen
        fut = self._deps.loop.submit(self._link.probe(self._cfg.probe_timeout))
        fut.add_done_callback(lambda f: self._tell(_Probed(gen, f)))

    def _on_probed(self, msg: _Probed) -> None:
        if msg.gen != self._gen or self._status != "online":
            return
        error = msg.future.exception()
        if error is not None:
            why = "no heartbeat answer" if isinstance(error, TimeoutError) else self._why(error)
            self._offline(f"heartbeat failed: {why}")
            return
        latency = msg.future.result()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set_status(
                    self.name, "online", heartbeat=time.time(), latency_ms=latency * 1000
                )
        self._resync()  # every cycle: a server that changed its tools unannounced is seen
        self._schedule_beat()

    def _on_lost(self, msg: _Lost) -> None:
        if msg.gen == self._gen and self._status in ("online", "connecting"):
            self._offline(f"connection lost: {msg.reason}")  # already scrubbed by the link

    # -- re-sync -------------------------------------------------------------------------
    def _resync(self) -> None:
        if self._status != "online" or self._link is None:
            return
        if self._syncing:
            self._dirty = True
            return
        wait = self._listed_at + MIN_RESYNC_GAP - time.monotonic()
        if wait > 0:
            # Too soon after the last one: one deferred re-sync takes every change meanwhile.
            if not self._resync_due:
                self._resync_due = True
                self._later(wait, _ResyncDue(self._gen))
            return
        self._listed_at = time.monotonic()
        self._syncing = True
        gen = self._gen
        fut = self._deps.loop.submit(self._link.list_tools(self._cfg.list_timeout))
        fut.add_done_callback(lambda f: self._tell(_Listed(gen, f)))

    def _on_listed(self, msg: _Listed) -> None:
        self._syncing = False
        if msg.gen != self._gen:
            return
        error = msg.future.exception()
        if error is not None:
            reason = self._why(error)
            log.warning("mcp server %s: listing its tools failed: %s", self.name, reason)
            if self._store is not None:
                self._store.set_status(
                    self.name,
                    self._status,
                    reason=self._reason,
                    error=f"tools/list failed: {reason}",
                )
        else:
            listed = msg.future.result()
            digest = listing_digest(listed)
            if digest != self._digest:
                self._apply(listed)
                self._digest = digest
        self._sync_extras()
        if self._dirty:
            self._dirty = False
            self._resync()

    # -- resources and prompts (chalie.mcp.extras) -----------------------------------------
    def _sync_extras(self) -> None:
        link = self._link
        if self._status != "online" or link is None:
            return
        gen, timeout = self._gen, self._cfg.list_timeout

        async def offer() -> tuple[dict[str, bool], list[Any], str]:
            caps = dict(link.capabilities())
            prompts = await link.list_prompts(timeout) if caps.get("prompts") else []
            shown = ""
            if caps.get("resources"):
                try:
                    found, templates = await link.list_resources(timeout)
                    names = [str(r.name or r.uri) for r in found[:8]]
                    names += [str(t.uri_template) for t in templates[:4]]
                    shown = ", ".join(names)
                    # Declared (the SDK always does) but empty: no proxy to list nothing.
                    caps["resources"] = bool(found or templates)
                except Exception:
                    shown = ""  # kept: the server says it has some
            return caps, prompts, shown

        fut = self._deps.loop.submit(offer())
        fut.add_done_callback(lambda f: self._tell(_ExtrasListed(gen, f)))

    def _on_extras(self, msg: _ExtrasListed) -> None:
        if msg.gen != self._gen:
            return
        error = msg.future.exception()
        if error is not None:
            log.info("mcp server %s: listing its prompts failed: %s", self.name, self._why(error))
            return
        caps, prompts, shown = msg.future.result()
        digest = f"{sorted(caps.items())}|{shown}|{listing_digest(prompts)}"
        if digest == self._extras_digest:
            return
        self._extras_digest = digest
        announce(
            self._deps,
            install_extras(
                self._deps.registry,
                self.name,
                resources=bool(caps.get("resources")),
                prompts=prompts,
                timeout=self._deps.timeout(self._spec),
                offered=shown,
                channels=self._spec.channels,
            ),
        )
        skills = []
        # A server scoped to channels brings its prompts there only: none is a playbook
        # find_skills could find (and inject) on another channel.
        for prompt in prompts if not self._spec.channels else ():
            try:
                skills.append(prompt_skill(self.name, prompt))
            except Exception as exc:
                log.info("mcp server %s: prompt not offered: %s", self.name, exc)
        serve_skills(self._deps, self.name, skills)

    def _apply(self, listed: list[Any]) -> None:
        assert self._store is not None
        held = list(self._rows.values())
        change = plan(self.name, held, listed, self._store.taken_names())
        if change.rows:
            self._store.write_tools(change.rows)
            for row in change.rows:
                self._rows[row.proxy] = row
            self._publish()
        installed = install(
            self._deps.registry,
            change.rows,
            enabled=True,
            timeout=self._deps.timeout(self._spec),
            channels=self._spec.channels,
        )
        announce(self._deps, installed)
        # tools that run as tasks live as long as a task may, not a call
        tasks = task_support(listed)
        if tasks:
            task_rows = [r for r in self._rows.values() if r.remote in tasks]
            lifetime = self._cfg.task_timeout
            announce(
                self._deps, install(self._deps.registry, task_rows, enabled=True, timeout=lifetime)
            )
        back_to_ask(self._deps, change.quarantined)
        self.last_sync = {
            "at": time.time(),
            "listed": len(listed),
            "added": len(change.added),
            "removed": len(change.removed),
            "quarantined": len(change.quarantined),
            "skipped": len(change.skipped),
        }
        if not change.empty:
            log.info("mcp server %s re-synced", self.name, extra=self.last_sync)

    def _on_refresh(self) -> None:
        if self._status == "needs-login" and not self._stopping:
            self._connect()  # chalie mcp login stored a new grant: use it now
        self._digest = ""  # rows changed under us (an approval): the next listing re-plans
        old = self._rows
        self._load_rows()
        self._publish()
        changed = [r for p, r in self._rows.items() if old.get(p) != r]
        announce(
            self._deps,
            install(
                self._deps.registry,
                changed,
                enabled=True,
                timeout=self._deps.timeout(self._spec),
                channels=self._spec.channels,
            ),
        )
        self._resync()

    # -- the call path's snapshot -------------------------------------------------------
    def _publish(self) -> None:
        """Publish what a call needs to know now (see chalie.mcp.connection_view)."""
        self._deps.routes[self.name] = ConnectionView(
            server=self.name,
            gen=self._gen,
            status=self._status,
            reason=self._reason,
            link=self._link if self._status == "online" else None,
            auth_status=self._auth_status,
            rows=dict(self._rows),
        )

    # -- the public surface -----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self._status,
            "reason": self._reason,
            "protocol": self._link.info.protocol if self._link and self._link.info else "",
            "tools": sum(1 for r in self._rows.values() if r.state == "active"),
            "last_sync": dict(self.last_sync),
        }

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ProbeConnection):
            self._on_beat(_Beat(message.gen))
        elif isinstance(message, _Connected):
            self._on_connected(message)
        elif isinstance(message, _Beat):
            self._on_beat(message)
        elif isinstance(message, _Probed):
            self._on_probed(message)
        elif isinstance(message, _Lost):
            self._on_lost(message)
        elif isinstance(message, _Changed):
            if message.gen == self._gen:
                self._resync()
        elif isinstance(message, _ResyncDue):
            self._resync_due = False
            if message.gen == self._gen:
                self._resync()
        elif isinstance(message, _Listed):
            self._on_listed(message)
        elif isinstance(message, _ExtrasListed):
            self._on_extras(message)
        elif isinstance(message, _Reconnect):
            waiting = self._status in ("offline", "needs-login")
            if message.gen == self._gen and waiting and not self._stopping:
                self._connect()
        elif isinstance(message, RefreshServer):
            self._on_refresh()
        elif isinstance(message, _FirstConnect):
            if self._link is None and not self._stopping:
                self._connect()
        else:
            return super().on_receive(message)
        return None
