"""ServerAsks: what Chalie answers when a connected server samples or elicits (on the loop).

Sampling (``sampling/createMessage``), in order:

1. The permission ``_mcp_<server>.sampling`` goes through the policy gate like a
   tool call (default ``ask``): the turn whose call the server is serving is
   asked, and the request shows the owner the server's whole prompt (bounded);
   with no human behind the call (the inbound agent channel, the subconscious,
   a request outside any call) ask becomes deny.
2. The server's daily token budget (its ``sampling_tokens``, else
   ``[mcp] sampling_tokens_per_day``; UTC days, in ``chalie.db``) must hold the
   prompt's estimate plus the answer's bound; past it the server gets an error.
3. The model (``[mcp] sampling_model``) answers the messages as data under
   Chalie's own system prompt, with no tools; what it spent is booked.

Elicitation (``elicitation/create``): with no human behind the call, decline.
URL mode: the owner is shown the link through the gate (permission
``_mcp_<server>.elicitation``; allowing means the owner will open it
themselves, Chalie never opens it) and the answer is accept or decline. Form
mode: a form asking for a credential is declined (never filled on the owner's
behalf); any other form is one durable request of the gate's
(``_mcp_<server>.elicitation``, a :class:`~chalie.wire.messages.PermissionRequest`
with the form's schema, stored in ``chalie.db``, listed by ``chalie policy
pending``): a setting of deny declines it, otherwise the owner, and only an
owner principal other than the one whose turn raised it, answers it from a chat
client (``answer`` with ``content``), ``chalie policy answer`` or ``chalie mcp
answer``; the answer is checked against the requested schema by the gate, and
the request expires to a decline after ``[mcp] elicitation_timeout``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import logging
import threading
import time
import uuid
from typing import Any, Final

from mcp_types import (
    INVALID_REQUEST,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    TextContent,
)

from actors.child_ref import ChildRef
from actors.gate.policy import ViewCache
from chalie.gate import policy as rules
from chalie.gate.approvals import call_binding
from chalie.gate.forms import fields as form_fields
from chalie.gate.forms import secret_fields
from chalie.mcp.peer import (
    MAX_SHOWN,
    CallScope,
    describe_request,
    estimate_tokens,
    model_request,
    sampling_prompt,
)
from chalie.process.config import McpConfig, ModelConfig
from chalie.store.sql import open_connection
from chalie.store.store_place import Place
from chalie.wire.actor_messages import GateAsk, RecordAsk, Withdraw
from chalie.wire.bus import EventBus
from chalie.wire.mcp_names import server_permission, server_tool
from chalie.wire.messages import GateDecision, TurnContext

log = logging.getLogger("chalie.mcp")

GATE_GRACE: Final = 30.0  # beyond the approval expiry, for the gate's own answer
SAMPLING_ERROR: Final = INVALID_REQUEST
_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS mcp_sampling ("
    "server TEXT NOT NULL, day TEXT NOT NULL, tokens INTEGER NOT NULL DEFAULT 0, "
    "requests INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (server, day))"
)


def permission(server: str, what: str) -> str:
    """The gate's permission for a server's request (``sampling`` or ``elicitation``)."""
    return server_permission(server, what)


def headless(server: str) -> TurnContext:
    """The context of a request no call holds: nobody to ask."""
    return TurnContext(
        conversation_id=f"mcp:{server}",
        turn_id=f"mcp:{server}",
        channel="subconscious",
        human_present=False,
        scope="restricted",
        initiator="framework",
    )


class Budget:
    """Tokens each server's sampling spent per UTC day, in the store.

    The table is the record; what this process knows of it is also kept in memory
    (:meth:`known`, read without a thread hop), since this is the table's one writer.
    :meth:`spent` and :meth:`book` touch the database (off the loop, on one thread, so a
    booking is in the table before a later read of it); :meth:`note` counts a booking in
    memory at once, so concurrent requests cannot overspend between the two.
    """

    def __init__(self, db_path: Place) -> None:
        self._conn = open_connection(db_path)
        self._conn.script(_SCHEMA)
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], int] = {}

    @staticmethod
    def today() -> str:
        return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")

    def known(self, server: str) -> int | None:
        """Today's spending as this process knows it (None: not read yet today)."""
        with self._lock:
            return self._known.get((server, self.today()))

    def note(self, server: str, tokens: int) -> None:
        """Count a booking in memory (where today's spending is known)."""
        key = (server, self.today())
        with self._lock:
            if key in self._known:
                self._known[key] += max(0, tokens)

    def spent(self, server: str) -> int:
        """Today's spending from the table (blocking), and known from now on."""
        day = self.today()
        with self._lock:
            row = self._conn.execute(
                "SELECT tokens FROM mcp_sampling WHERE server = ? AND day = ?", (server, day)
            ).fetchone()
            spent = int(row[0]) if row else 0
            self._known = {k: v for k, v in self._known.items() if k[1] == day}
            self._known[(server, day)] = spent
        return spent

    def book(self, server: str, tokens: int) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO mcp_sampling (server, day, tokens, requests) VALUES (?, ?, ?, 1) "
                "ON CONFLICT (server, day) DO UPDATE SET "
                "tokens = mcp_sampling.tokens + excluded.tokens, "
                "requests = mcp_sampling.requests + 1",
                (server, self.today(), max(0, tokens)),
            )

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class ServerAsks:
    """The Asks of every connection (chalie.mcp.peer); runs on the daemon's loop."""

    def __init__(
        self,
        config: McpConfig,
        db_path: Place,
        policy: ChildRef[Any] | None,
        bus: EventBus | None,
        models: dict[str, ModelConfig],
        *,
        approval_expiry: float = 300.0,
        model_client: Any = None,
        trail: Any = None,
    ) -> None:
        """``trail``: where a request's decision goes on the action trail (a ChildRef of the
        dispatcher, the trail's one writer; None: not recorded)."""
        self._trail = trail
        self._cfg = config
        self._policy = policy
        self._bus = bus
        self._model_cfg = models.get(config.sampling_model)
        self._client: Any = model_client  # made on the loop at first use
        self._expiry = approval_expiry
        self._budget = Budget(db_path)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcp-budget")
        self._views = ViewCache()  # on the loop only

    async def aclose(self) -> None:
        """Close the model's connections (on the loop)."""
        client, self._client = self._client, None
        if client is not None and hasattr(client, "aclose"):
            await client.aclose()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._budget.close()

    # -- the gate ----------------------------------------------------------------------
    async def _gate(
        self,
        server: str,
        scope: CallScope | None,
        what: str,
        summary: str,
        params: dict[str, Any],
        *,
        form: dict[str, Any] | None = None,
        expires_in: float | None = None,
    ) -> GateDecision | None:
        """The gate's decision for a server's request; None when there is no gate.

        ``form``: the owner fills it (a durable request of the gate's, answered from chat,
        ``chalie policy answer`` or ``chalie mcp answer``); the decision carries the answer.
        A request the server gives up on (its call cancelled) is withdrawn from the gate.
        """
        policy = self._policy
        if policy is None:
            return None
        context = scope.context if scope is not None and scope.context is not None else None
        reply: concurrent.futures.Future[GateDecision] = concurrent.futures.Future()
        tool = scope.proxy if scope is not None else server_tool(server)
        needs = permission(server, what)
        ask = GateAsk(
            call_id=(scope.call_id if scope is not None and scope.call_id else uuid.uuid4().hex),
            context=context or headless(server),
            tool=tool,
            permission=needs,
            internal=False,
            act_summary=summary[:200],
            params_redacted=params,
            reply=reply,
            form=form,
            expires_in=expires_in,
            binding=call_binding(tool, needs, params, None),
        )
        now = self._gate_now(ask)
        if now is not None:
            self._record(ask, now)
            return now
        wait = (self._expiry if expires_in is None else expires_in) + GATE_GRACE
        try:
            policy.tell(ask)
            decision = await asyncio.wait_for(asyncio.wrap_future(reply), wait)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                policy.tell(Withdraw(reply))
            raise
        except Exception as exc:
            log.warning("the gate did not decide %s for %s: %s", what, server, exc)
            return None
        self._record(ask, decision)
        return decision

    def _gate_now(self, ask: GateAsk) -> GateDecision | None:
        """The decision without a hop to the PolicyActor, where the operator's table settles
        it (allow or deny, read from its lock-free view, the one rule applied as the
        dispatcher's fast path does); None: the actor decides (ask, unseen, a form to fill)."""
        policy = self._policy
        try:
            if policy is None or not policy.is_alive():
                return None
            view = self._views.get(policy.current())
            if view is None:
                return None
            setting = view.setting(ask.context.channel, ask.permission)
        except Exception:
            return None
        if setting not in ("allow", "deny") or (ask.form is not None and setting != "deny"):
            return None
        return rules.gate_rule(
            setting,
            permission=ask.permission,
            channel=ask.context.channel,
            human_present=ask.context.human_present,
            internal=False,
        )

    def _record(self, ask: GateAsk, decision: GateDecision) -> None:
        """The decision on the action trail, through its one writer (never waited on)."""
        trail = self._trail
        if trail is None:
            return
        try:
            trail.tell(
                RecordAsk(
                    call_id=ask.call_id,
                    context=ask.context,
                    permission=ask.permission,
                    params=ask.params_redacted,
                    act_summary=ask.act_summary,
                    decision=decision.decision,
                    decided_by=str(decision.decided_by),
                    code=decision.code,
                )
            )
        except Exception as exc:
            log.info("the trail did not take %s: %s", ask.permission, exc)

    # -- sampling ------------------------------------------------------------------------
    async def sample(
        self,
        server: str,
        scope: CallScope | None,
        params: CreateMessageRequestParams,
        budget: int | None = None,
    ) -> CreateMessageResult | ErrorData:
        started = time.monotonic()
        prompt = sampling_prompt(params)
        bound = min(int(params.max_tokens), self._cfg.sampling_max_tokens)
        if self._model_cfg is None:
            return self._refuse(server, f"no model [models.{self._cfg.sampling_model}]")
        decision = await self._gate(
            server,
            scope,
            "sampling",
            f"the MCP server {server} asks Chalie's model: {' '.join(prompt.split())[:150]}",
            {"prompt": prompt[:MAX_SHOWN], "max_tokens": bound},
        )
        if decision is None or not decision.allowed:
            why = decision.message if decision is not None else "the gate is unavailable"
            return self._refuse(server, f"sampling was not allowed ({why})")
        loop = asyncio.get_running_loop()
        limit = self._cfg.sampling_tokens_per_day if budget is None else budget
        spent = self._budget.known(server)
        if spent is None:  # the first request of the day: read the table, off the loop
            spent = await loop.run_in_executor(self._pool, self._budget.spent, server)
        estimate = estimate_tokens(prompt) + bound
        if spent + estimate > limit:
            return self._refuse(
                server, f"its sampling budget for today is spent ({spent} of {limit} tokens)"
            )
        request = model_request(params, bound)
        try:
            client = self._model()
            answer = await client.complete(request, lambda _delta: None)
        except Exception as exc:
            code = getattr(exc, "code", type(exc).__name__)
            log.warning("sampling for %s failed at the model: %s", server, code)
            return self._refuse(server, f"the model failed ({code})")
        used = answer.usage.total or estimate_tokens(prompt) + estimate_tokens(answer.text)
        self._budget.note(server, used)
        loop.run_in_executor(self._pool, self._budget.book, server, used)
        log.info(
            "sampled for mcp server %s",
            server,
            extra={"tokens": used, "ms": round((time.monotonic() - started) * 1000, 1)},
        )
        return CreateMessageResult(
            role="assistant",
            content=TextContent(type="text", text=answer.text),
            model=self._model_cfg.model,
            stop_reason="maxTokens" if answer.stop == "length" else "endTurn",
        )

    def _model(self) -> Any:
        if self._client is None:
            from chalie.providers.client import ModelClient

            assert self._model_cfg is not None
            self._client = ModelClient(self._cfg.sampling_model, self._model_cfg)
        return self._client

    @staticmethod
    def _refuse(server: str, why: str) -> ErrorData:
        log.info("mcp server %s: sampling refused: %s", server, why)
        return ErrorData(code=SAMPLING_ERROR, message=f"Chalie refused to sample: {why}")

    # -- elicitation -----------------------------------------------------------------------
    async def elicit(
        self, server: str, scope: CallScope | None, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        shown = describe_request(server, params)
        if scope is None or not scope.human:
            log.info("mcp server %s elicited with nobody to ask: declined", server)
            return ElicitResult(action="decline")
        if not isinstance(params, ElicitRequestFormParams):
            url = str(getattr(params, "url", ""))[:2000]
            decision = await self._gate(
                server, scope, "elicitation", shown, {"url": url, "message": params.message}
            )
            # Never opened here: allowing means the owner opens it themselves.
            accepted = decision is not None and decision.allowed
            return ElicitResult(action="accept" if accepted else "decline")
        schema = params.requested_schema
        schema_dict: dict[str, Any] = (
            schema
            if isinstance(schema, dict)
            else schema.model_dump(by_alias=True, exclude_none=True)
        )
        secrets = secret_fields(schema_dict)
        if secrets:
            log.info("mcp server %s asked for secrets (%s): declined", server, ", ".join(secrets))
            return ElicitResult(action="decline")
        decision = await self._gate(
            server,
            scope,
            "elicitation",
            shown,
            {"message": params.message[:MAX_SHOWN], "fields": form_fields(schema_dict)},
            form=schema_dict,
            expires_in=self._cfg.elicitation_timeout,
        )
        if decision is None or not decision.allowed or decision.content is None:
            return ElicitResult(action="decline")
        log.info("mcp server %s: the owner answered its form", server)
        return ElicitResult(action="accept", content=decision.content)


__all__ = ["Budget", "ServerAsks", "headless", "permission"]
